"""A stream resumed on a gateway other than the one that gave its cursor: the live output
the cursor covers is not sent again. Real NATS (the LIVE stream); the gateway's feed and
live hub, without the HTTP around them."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from nats.aio.client import Client as NATS

from suzumio.contracts.subjects import Topology
from suzumio.gateway.feed import Cursor, Item, SessionFeed
from suzumio.gateway.livehub import LiveHub
from suzumio.gateway.state import Gateway
from suzumio.platform.bus.jsapi import ensure_streams


class Watcher:
    def deliver(self, seq: int, data: bytes) -> None:
        pass


async def never_refused() -> None:
    return None


async def first_item(gateway: Gateway, hub: LiveHub, cursor: Cursor) -> Item:
    """The first item of s1's feed from `cursor`; the feed and the hub closed after."""
    feed = SessionFeed(gateway, "s1", cursor, never_refused)
    await feed.open()
    try:
        item = await asyncio.wait_for(anext(feed.items()), 10)
    finally:
        await feed.close()
        await hub.close()
    assert item is not None
    return item


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
    item = await first_item(gateway, hub, Cursor(events=0, live=1_000))
    assert (item.event, item.data) == ("live", b"kept")


async def test_a_cursor_of_a_live_made_again_since_reads_all_the_new_one_holds(
    nc: NATS, topology: Topology
) -> None:
    """A client away across a NATS restart comes back with a cursor of the old LIVE's
    numbering, which the new LIVE — busy with other sessions — has already passed. By its
    sequence alone the cursor would skip the session's new output numbered below it; its
    generation says it is of another LIVE, and all the new one holds of the session is sent."""
    js = nc.jetstream()
    hub = LiveHub(nc, topology)
    gateway = cast("Gateway", cast("Any", SimpleNamespace(nc=nc, topology=topology, live=hub)))
    first = SessionFeed(gateway, "s1", Cursor(), never_refused)
    await first.open()
    await first.close()
    old = first.cursor  # as given out before the restart
    assert old.generation is not None
    await js.delete_stream(topology.live_stream)  # a NATS restart loses LIVE ...
    await ensure_streams(nc, topology.streams())  # ... and a service makes it again
    await js.publish(topology.live_subject("s1"), b"new output")  # sequence 1
    for _ in range(5):  # other sessions move the new LIVE past the old cursor
        await js.publish(topology.live_subject("s2"), b"other")
    resumed = Cursor.parse(f"{old.events}.3.{old.generation}")
    item = await first_item(gateway, hub, resumed)
    assert (item.event, item.data) == ("live", b"new output")
    assert item.cursor is not None
    assert item.cursor.split(".")[2] != old.generation
