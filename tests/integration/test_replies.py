"""Requests over the connection's one reply subscription (`Replies`), and the Direct Gets
built on it, against a real NATS server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.events import ProjectCreated, ProjectRenamed, SessionMessageAppended
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.contracts.values import Author
from suzumio.platform.bus import connection, direct_get
from suzumio.platform.bus.direct_get import iter_subject, last_for_subject
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.bus.jsapi import ensure_streams
from suzumio.platform.bus.replies import Replies
from suzumio.platform.embedded.nats import start_nats
from suzumio.testing.servers import fresh_topology


async def _project_with_renames(store: EventStore, renames: int) -> str:
    project = new_id()
    await store.append(project, [ProjectCreated(name="p0", owner_id="user-1")], 0, EventMeta())
    for i in range(1, renames + 1):
        other = new_id()  # interleaved: another aggregate's events between ours
        await store.append(other, [ProjectCreated(name="x", owner_id="user-1")], 0, EventMeta())
        await store.append(project, [ProjectRenamed(name=f"p{i}")], i, EventMeta())
    return project


async def test_a_load_pages_through_batches_in_order(
    nc: NATS, store: EventStore, topology: Topology
) -> None:
    project = await _project_with_renames(store, 7)
    subject = topology.event_subject("project", project)
    every = [m async for m in iter_subject(nc, topology.events_stream, subject, batch=3)]
    assert [m.headers["Suzumio-Version"] for m in every] == [str(v) for v in range(1, 9)]
    assert all(m.subject == subject for m in every)
    later = [
        m
        async for m in iter_subject(
            nc, topology.events_stream, subject, after_seq=every[4].seq, batch=2
        )
    ]
    assert [m.seq for m in later] == [m.seq for m in every[5:]]
    assert (await store.load("project", project)).version == 8
    # Asked of a replica holding the stream up to a point at least (the server takes the
    # field: a follower behind it hands the request to the leader; one server, as here, is
    # its own leader and answers as before).
    end = every[-1].seq
    held = [m async for m in iter_subject(nc, topology.events_stream, subject, min_last_seq=end)]
    assert [m.seq for m in held] == [m.seq for m in every]


async def test_a_load_brings_a_bounded_number_of_bytes_per_round_trip(
    nc: NATS, store: EventStore, topology: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server sends a Direct Get batch whole, with no flow control, and it waits in memory
    for the reader: a batch is bounded in bytes as well as in messages."""
    monkeypatch.setattr(direct_get, "BATCH_BYTES", 1_500_000)
    session = new_id()
    for version in range(6):  # six events of about a megabyte each
        text = "x" * 1_000_000
        said = SessionMessageAppended(
            message_id=new_id(), author=Author(kind="user", id="u"), role="user", text=text
        )
        await store.append(session, [said], version)
    trips = 0
    replies = Replies.replies

    def counted(self: Replies, *args: Any, **kwargs: Any) -> Any:
        nonlocal trips
        trips += 1
        return replies(self, *args, **kwargs)

    monkeypatch.setattr(Replies, "replies", counted)
    subject = topology.event_subject("session", session)
    every = [m async for m in direct_get.iter_subject(nc, topology.events_stream, subject)]
    assert len(every) == 6
    assert trips == 3  # two of the large ones a round trip: the second passes the bound


async def test_loads_and_lookups_make_no_subscription_of_their_own(tmp_path: Path) -> None:
    """A dedicated server, to count the subscriptions made on its monitoring port."""
    server = start_nats(tmp_path / "nats")
    try:
        topology = fresh_topology()
        nc = await connection.connect(server.url, "suzumio-test-replies")
        try:
            await ensure_streams(nc, topology.streams())
            store = EventStore(nc, topology)
            project = await _project_with_renames(store, 3)
            before = await _inserted(server.extra["monitoring"])
            for _ in range(5):
                await store.load("project", project)
                await store.head("project", project)
                async for _m in iter_subject(
                    nc, topology.events_stream, topology.event_subject("project", project)
                ):
                    break  # a reader that stops early
            assert await store.load("project", project) is not None
            assert await _inserted(server.extra["monitoring"]) == before
        finally:
            await nc.close()
    finally:
        server.stop()


async def _inserted(monitoring: str) -> int:
    """How many subscriptions the server has ever made (its only client is the test's)."""
    async with httpx.AsyncClient() as client:
        reply = await client.get(f"{monitoring}/subsz")
    return int(reply.json()["num_inserts"])


async def test_replies_come_in_order_and_a_silence_times_out(nc: NATS) -> None:
    subject = f"test.replies.{new_id()}"

    async def answer_twice(msg: Msg) -> None:
        await nc.publish(msg.reply, b"one")
        await nc.publish(msg.reply, b"two")

    sub = await nc.subscribe(subject, cb=answer_twice)
    try:
        got: list[bytes] = []

        async def read_all() -> None:
            async for msg in Replies.of(nc).replies(subject, b"", timeout=0.3):
                got.append(msg.data)

        with pytest.raises(NatsTimeoutError):
            await read_all()
        assert got == [b"one", b"two"]
        # One that stops reading drops the rest; the next request gets only its own replies.
        stream = Replies.of(nc).replies(subject, b"", timeout=1)
        assert (await anext(stream)).data == b"one"
        await stream.aclose()
        again = Replies.of(nc).replies(subject, b"", timeout=1)
        assert [(await anext(again)).data, (await anext(again)).data] == [b"one", b"two"]
        await again.aclose()
    finally:
        await sub.unsubscribe()


async def test_a_request_nobody_listens_to_fails_at_once(nc: NATS, topology: Topology) -> None:
    replies = Replies.of(nc)
    assert Replies.of(nc) is replies
    with pytest.raises(NoRespondersError):
        await asyncio.wait_for(replies.request(f"test.nobody.{new_id()}", b"", None, 5), 2)
    with pytest.raises(NoRespondersError):
        await anext(replies.replies(f"test.nobody.{new_id()}", b"", 5))
    # and a Direct Get for a subject with nothing stored answers None, not an error
    assert (
        await last_for_subject(nc, topology.events_stream, f"{topology.namespace}.ev.x.y") is None
    )
