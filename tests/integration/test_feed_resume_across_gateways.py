"""A stream resumed on a gateway other than the one that gave its cursor: the live output
the cursor covers is not sent again. Real NATS (the LIVE stream); the gateway's feed and
live hub, without the HTTP around them."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from nats.aio.client import Client as NATS

from suzumio.contracts.subjects import Topology
from suzumio.gateway.feed import Cursor, SessionFeed
from suzumio.gateway.livehub import LiveHub
from suzumio.gateway.state import Gateway


class Watcher:
    def deliver(self, seq: int, data: bytes) -> None:
        pass


async def never_refused() -> None:
    return None


async def test_a_cursor_from_another_gateway_does_not_replay_what_it_covers(
    nc: NATS, topology: Topology
) -> None:
    js = nc.jetstream()
    for text in (b"one", b"two"):  # what the client saw already, on the other gateway
        await js.publish(topology.live_subject("s1"), text)
    hub = LiveHub(nc, topology)
    await hub.join("s1", Watcher())  # this gateway's channel for s1 opens here, at 2
    for _ in range(5):  # other sessions' output moves LIVE on
        await js.publish(topology.live_subject("s2"), b"other")
    end = (await js.stream_info(topology.live_stream)).state.last_seq
    gateway = cast("Gateway", cast("Any", SimpleNamespace(nc=nc, topology=topology, live=hub)))
    # The other gateway opened its channel later, at `end`, and gave that as the cursor.
    feed = SessionFeed(gateway, "s1", Cursor(events=0, live=end), never_refused)
    await feed.open()
    try:
        await js.publish(topology.live_subject("s1"), b"three")
        items = feed.items()
        item = await asyncio.wait_for(anext(items), 10)
    finally:
        await feed.close()
        await hub.close()
    assert item is not None
    assert (item.event, item.data) == ("live", b"three")  # not "one" again


async def test_a_cursor_past_the_end_of_live_starts_from_what_it_holds(
    nc: NATS, topology: Topology
) -> None:
    """LIVE numbers from 1 again after a server restart: such a cursor names nothing."""
    js = nc.jetstream()
    await js.publish(topology.live_subject("s1"), b"kept")
    hub = LiveHub(nc, topology)
    gateway = cast("Gateway", cast("Any", SimpleNamespace(nc=nc, topology=topology, live=hub)))
    feed = SessionFeed(gateway, "s1", Cursor(events=0, live=1_000), never_refused)
    await feed.open()
    try:
        item = await asyncio.wait_for(anext(feed.items()), 10)
    finally:
        await feed.close()
        await hub.close()
    assert item is not None
    assert (item.event, item.data) == ("live", b"kept")
