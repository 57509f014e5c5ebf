"""A stream resumed from an early cursor of a long session: the log up to where the feed
opened is read as the client takes it, a batch at a time — not pushed into the gateway, where
a slow client piled up to 256 MiB of it (nats-py lifts the consumer's flow control when the
server says it stalled, whatever was read). Real NATS; the gateway's feed and live hub,
without the HTTP around them."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any, cast

from nats.aio.client import Client as NATS

from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.gateway.feed import Cursor, SessionFeed
from suzumio.gateway.livehub import LiveHub
from suzumio.gateway.state import Gateway

MESSAGES = 40
TEXT = "x" * 256 * 1024  # 10 MiB of log in all


async def never_refused() -> None:
    return None


def envelope(n: int) -> bytes:
    return json.dumps({"type": "session.message_appended", "n": n, "text": TEXT}).encode()


def events_of(cursor: str | None) -> int:
    assert cursor is not None
    return int(cursor.split(".")[0])


async def test_a_long_log_is_read_as_the_client_takes_it_then_followed(
    nc: NATS, topology: Topology
) -> None:
    js = nc.jetstream()
    session = new_id()
    subject = topology.event_subject("session", session)
    seqs = [(await js.publish(subject, envelope(n))).seq for n in range(MESSAGES)]
    hub = LiveHub(nc, topology)
    gateway = cast("Gateway", cast("Any", SimpleNamespace(nc=nc, topology=topology, live=hub)))
    feed = SessionFeed(gateway, session, Cursor(events=0, live=0), never_refused)
    await feed.open()
    try:
        await asyncio.sleep(1.0)  # the client reads nothing yet
        assert feed._sub is not None
        held = feed._event_bytes + feed._sub.pending_bytes  # queued, and in nats-py's hands
        assert held < len(TEXT)  # none of the log was pushed here
        items = feed.items()
        got = [await asyncio.wait_for(anext(items), 10) for _ in range(MESSAGES)]
        later = (await js.publish(subject, envelope(MESSAGES))).seq  # stored after it opened
        last = await asyncio.wait_for(anext(items), 10)
    finally:
        await feed.close()
        await hub.close()
    assert [json.loads(i.data)["n"] for i in got if i is not None] == list(range(MESSAGES))
    assert [events_of(i.cursor) for i in got if i is not None] == seqs
    assert last is not None
    assert (json.loads(last.data)["n"], events_of(last.cursor)) == (MESSAGES, later)
