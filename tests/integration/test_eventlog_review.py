"""Review of the event log's machinery on real NATS and Postgres: the follower under a slow
reader, the projector under transient Postgres trouble, parking records."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest
from nats.aio.client import Client as NATS
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.client import JetStreamContext

from suzumio.contracts.envelope import DomainEvent, EventMeta
from suzumio.contracts.events import MessageParked, ProjectCreated, SessionMessageAppended
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.contracts.values import Author
from suzumio.platform.bus import direct_get
from suzumio.platform.bus import follower as follower_module
from suzumio.platform.bus.eventstore import AppendResult, EventStore
from suzumio.platform.bus.follower import LogFollower, LogMessage
from suzumio.platform.bus.jsapi import stream_last_seq
from suzumio.platform.db.pool import Connection, Pool
from suzumio.platform.projections.base import Events, Projection
from suzumio.session.projections.projects import ProjectsProjection
from tests.integration.projector_support import caught_up, running_projector
from tests.support import eventually


def overflowing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Followers' subscriptions drop what passes 20 pending messages (a "slow consumer"): the
    default limit (512K messages or 256 MB: a long log's replay), made small to get there."""
    subscribe = JetStreamContext.subscribe

    async def small(self: JetStreamContext, *args: Any, **kwargs: Any) -> Any:
        kwargs["pending_msgs_limit"] = 20
        return await subscribe(self, *args, **kwargs)

    monkeypatch.setattr(JetStreamContext, "subscribe", small)


async def followed(
    nc: NATS, store: EventStore, topology: Topology, count: int, **options: Any
) -> tuple[list[LogMessage], range]:
    """What a follower with a slow reader hands out of `count` appends, and what it should."""
    start = await stream_last_seq(nc, topology.events_stream) + 1
    follower = LogFollower(nc, topology, start_seq=start, queue_size=5, **options)
    await follower.start()
    try:
        await asyncio.gather(
            *(
                store.append(new_id(), [ProjectCreated(name="p", owner_id="u")], 0)
                for _ in range(count)
            )
        )
        last = await stream_last_seq(nc, topology.events_stream)
        await asyncio.sleep(1.0)  # all of them pushed while nobody reads
        seen: list[LogMessage] = []
        while not seen or seen[-1].seq < last:
            msg = await follower.next(timeout=10)
            assert msg is not None, f"nothing after {seen[-1].seq if seen else None}, {last}"
            seen.append(msg)
    finally:
        await follower.close()
    return seen, range(start, last + 1)


async def test_a_slow_follower_loses_no_message_when_its_subscription_overflows(
    nc: NATS, store: EventStore, topology: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower whose reader is slow blocks in its callback; nats-py answers flow control
    as messages arrive (not as the callback takes them), so the server keeps pushing and the
    subscription drops what overflows it after the ordered consumer already counted it as
    seen: without a check of its own the follower would skip events silently."""
    overflowing(monkeypatch)
    seen, due = await followed(nc, store, topology, 300)
    assert [m.seq for m in seen] == list(due)
    now = datetime.now(UTC)
    assert all(timedelta(0) <= now - m.stored_at < timedelta(minutes=1) for m in seen)


async def test_a_gap_read_ending_short_skips_nothing(
    nc: NATS, store: EventStore, topology: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gap's read may end short of it: with a replicated stream, a replica behind the rest
    answers "no more". The message that revealed the gap must then wait (the next one, or the
    tail check, reads on), not be queued past the messages still missing."""
    read = direct_get.iter_subject

    async def behind(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        got = 0
        async for stored in read(*args, **kwargs):
            yield stored
            got += 1
            if got == 3:
                return  # what a lagging replica holds of it

    overflowing(monkeypatch)
    monkeypatch.setattr(follower_module, "iter_subject", behind)
    seen, due = await followed(nc, store, topology, 200, check_every=0.2)
    assert [m.seq for m in seen] == list(due)


async def test_a_follower_holds_a_bounded_number_of_bytes_for_a_slow_reader(
    nc: NATS, store: EventStore, topology: Topology
) -> None:
    """Ten thousand messages of megabytes each (history a sandbox wrote) held for a reader
    that is behind were gigabytes: the queue is bounded in bytes as well as in messages, and
    what waits stays on the server."""
    start = await stream_last_seq(nc, topology.events_stream) + 1
    follower = LogFollower(nc, topology, start_seq=start, queue_bytes=2_500_000)
    await follower.start()
    try:
        session = new_id()
        for version in range(8):  # eight events of about a megabyte each
            said = SessionMessageAppended(
                message_id=new_id(), author=Author(kind="user", id="u"), role="user",
                text="x" * 1_000_000,
            )  # fmt: skip
            await store.append(session, [said], version)
        await asyncio.sleep(1.0)  # all of them pushed while nobody reads
        assert follower._queue.qsize() <= 3  # the third passes the bound, no more after it
        seen: list[int] = []
        while len(seen) < 8:
            msg = await follower.next(timeout=10)
            assert msg is not None, f"nothing after {len(seen)} of 8"
            seen.append(msg.seq)
    finally:
        await follower.close()
    assert seen == list(range(seen[0], seen[0] + 8))  # every one, in order


async def test_a_quiet_follower_whose_consumer_is_lost_goes_on_from_where_it_started(
    nc: NATS, store: EventStore, topology: Topology
) -> None:
    """nats-py recreates an ordered consumer (a NATS restart, lost heartbeats) from the last
    sequence it delivered, counted from 0: a follower that had not had a message yet (a quiet
    log) was sent the whole log again from 1, and the new events waited behind it."""
    for _ in range(5):
        await store.append(new_id(), [ProjectCreated(name="p", owner_id="u")], 0)
    start = await stream_last_seq(nc, topology.events_stream) + 1
    follower = LogFollower(nc, topology, start_seq=start)
    # Each step bounded on its own, so that one which hangs says which (twice in CI on
    # 2026-12-05 the test as a whole ran past pytest's 120 s, with no step named).
    async with step("start", 20):
        await follower.start()
    try:
        sub: Any = follower._sub
        lost = sub._consumer
        js = nc.jetstream()
        async with step("delete the consumer", 20):
            await js.delete_consumer(topology.events_stream, lost)  # as a NATS restart loses it
        # Made again once its heartbeats are missed (two of 5 s, checked every 10 s).
        await eventually(lambda: asyncio.sleep(0, sub._consumer), lambda c: c != lost, timeout=60)
        jsi = sub._sub._jsi
        assert jsi._ccreq.opt_start_seq == start, (jsi._ccreq.opt_start_seq, start)
        async with step("append", 20):
            await store.append(new_id(), [ProjectCreated(name="p", owner_id="u")], 0)
        msg = await follower.next(timeout=20)
        assert msg is not None
        assert msg.seq == start, (msg.seq, start)
    finally:
        async with step("close", 10):
            await follower.close()


@contextlib.asynccontextmanager
async def step(what: str, seconds: float) -> AsyncIterator[None]:
    """`what`, failed by name if it takes longer than `seconds`."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        pytest.fail(f"{what} took longer than {seconds} s")


async def test_a_message_with_a_malformed_version_header_does_not_stop_a_follower(
    nc: NATS, store: EventStore, topology: Topology
) -> None:
    """Only the event store writes the log, but a message with a header that is no number
    (`Suzumio-Version: x`) raised as the follower read it — and again at each gap read after
    every later message: the folds behind the follower stopped for good."""
    start = await stream_last_seq(nc, topology.events_stream) + 1
    follower = LogFollower(nc, topology, start_seq=start)
    await follower.start()
    try:
        odd = new_id()
        first = await store.append(odd, [ProjectCreated(name="p", owner_id="u")], 0)
        stored = await store.load("project", odd)
        await nc.jetstream().publish(
            topology.event_subject("project", new_id()),
            stored.events[0].envelope.model_dump_json(by_alias=True).encode(),
            headers={"Suzumio-Type": "project.created", "Suzumio-Version": "x"},
        )
        after = await store.append(new_id(), [ProjectCreated(name="q", owner_id="u")], 0)
        seen: list[LogMessage] = []
        while not seen or seen[-1].seq < after.events[-1].seq:
            msg = await follower.next(timeout=10)
            assert msg is not None, f"stopped after {seen[-1].seq if seen else None}"
            seen.append(msg)
    finally:
        await follower.close()
    assert [m.seq for m in seen] == list(range(first.events[0].seq, after.events[-1].seq + 1))
    assert [m.version for m in seen] == [1, 1, 1]  # the odd one's from its envelope


class DiskFullProjects(ProjectsProjection):
    """The projects projection on a Postgres whose disk is full for a while: every write of
    it fails (SQLSTATE 53100, raised by the server) until `full` is cleared."""

    name: ClassVar[str] = "diskfull"
    full: ClassVar[bool] = True

    async def apply(self, conn: Connection, schema: str, events: Events) -> None:
        if DiskFullProjects.full:
            await conn.execute(
                "DO $$ BEGIN RAISE EXCEPTION 'could not extend file: No space left on device'"
                " USING ERRCODE = 'disk_full'; END $$"
            )
        await super().apply(conn, schema, events)


async def test_a_postgres_short_of_resources_parks_no_event(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology
) -> None:
    """A full disk (or memory, or an I/O error) says nothing about the event: the projection
    must wait for the server to recover, not give the event up as poison after three tries
    (a parked event is skipped for good)."""
    projections: list[Projection] = [DiskFullProjects()]
    DiskFullProjects.full = False
    async with running_projector(nc, database_url, topology, store, projections):
        await caught_up(nc, pool, topology, projections)
    DiskFullProjects.full = True
    pid = new_id()
    async with running_projector(nc, database_url, topology, store, projections):
        await store.append(pid, [ProjectCreated(name="kept", owner_id="u")], 0)
        await asyncio.sleep(6.0)  # time for three and more attempts
        DiskFullProjects.full = False
        await caught_up(nc, pool, topology, projections, timeout=60)
    name = await pool.fetchval("SELECT name FROM proj_diskfull.projects WHERE id = $1", pid)
    assert name == "kept"
    parked = await store.load("consumer", "projector-diskfull")
    assert parked.events == ()


class PoisonedProjects(ProjectsProjection):
    """The projects projection with a bug: it cannot digest a project named 'poison'."""

    name: ClassVar[str] = "poisonrec"

    async def apply(self, conn: Connection, schema: str, events: Events) -> None:
        for e in events:
            if isinstance(e.data, ProjectCreated) and e.data.name == "poison":
                raise ValueError("indigestible")
        await super().apply(conn, schema, events)


class ParkingOutage(EventStore):
    """An event store whose first appends of parking records fail (NATS away for a moment),
    as a projector killed between its commit and the record would leave it."""

    failures = 2

    async def append_next(
        self,
        aggregate_id: str,
        events: Sequence[DomainEvent],
        meta: EventMeta | None = None,
        *,
        attempts: int = 20,
        likely_version: int | None = None,
    ) -> AppendResult:
        if self.failures and isinstance(events[0], MessageParked):
            self.failures -= 1
            raise NatsTimeoutError
        return await super().append_next(
            aggregate_id, events, meta, attempts=attempts, likely_version=likely_version
        )


@pytest.mark.parametrize("live", [True, False], ids=["live", "build"])
async def test_an_event_is_skipped_only_once_its_parking_is_recorded(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology, live: bool
) -> None:
    """Parking skips the event for good; its record on `ev.consumer.projector-<name>` is the
    only trace of that. A projector that committed the skip and then could not append the
    record (NATS away, or killed in between) lost the event without a trace: the skip must
    commit only with its record stored."""
    projections: list[Projection] = [PoisonedProjects()]
    outage = ParkingOutage(nc, topology)
    if live:  # built before the poison comes: the live projector meets it
        async with running_projector(nc, database_url, topology, store, projections):
            await caught_up(nc, pool, topology, projections)
    await store.append(new_id(), [ProjectCreated(name="a", owner_id="u")], 0)
    poisoned = await store.append(new_id(), [ProjectCreated(name="poison", owner_id="u")], 0)
    await store.append(new_id(), [ProjectCreated(name="b", owner_id="u")], 0)
    # Else the projector's first build of the projection meets it.
    async with running_projector(nc, database_url, topology, outage, projections):
        await caught_up(nc, pool, topology, projections, timeout=60)
        parked = await eventually(
            lambda: store.load("consumer", "projector-poisonrec"),
            lambda s: s.version >= 1,
            timeout=30,
            what="the parking record",
        )
    rows = await pool.fetch("SELECT name FROM proj_poisonrec.projects ORDER BY name")
    assert [r["name"] for r in rows] == ["a", "b"]
    assert [e.data.stream_seq for e in parked.events if isinstance(e.data, MessageParked)] == [
        poisoned.seq
    ]
    assert outage.failures == 0
