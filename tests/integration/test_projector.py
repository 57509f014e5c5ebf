"""The projections framework on real NATS and Postgres: exactly-once application, skipping
of unknown types, parking of poison events, rebuilds that equal the live tables."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any, ClassVar

import asyncpg
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from structlog.testing import capture_logs

from suzumio.contracts.events import MessageParked, ProjectCreated, ProjectRenamed
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.eventstore import HDR_MSG_ID, HDR_TYPE, HDR_VERSION, EventStore
from suzumio.platform.db import pool as db
from suzumio.platform.db.pool import Connection, Pool
from suzumio.platform.projections import checkpoints as checkpoints_module
from suzumio.platform.projections import load_projections
from suzumio.platform.projections import projector as projector_module
from suzumio.platform.projections import rebuild as rebuild_module
from suzumio.platform.projections.base import Events, Projection, live_schema
from suzumio.platform.projections.checkpoints import read_all
from suzumio.platform.projections.decoding import decode_entry
from suzumio.platform.projections.projector import Projector, _ResetError
from suzumio.platform.projections.reader import LogReader
from suzumio.platform.projections.rebuild import RebuildGapError, _Replay, rebuild
from suzumio.platform.projections.verify import verify
from suzumio.platform.service.health import Readiness
from suzumio.session.projections.projects import ProjectsProjection
from tests.integration.projector_support import (
    caught_up,
    publish_newer_schema_event,
    running_projector,
)
from tests.scenario import Scenario, write
from tests.support import eventually

ALL = load_projections()
SERVING = "SELECT serving FROM suzumio.projection_checkpoints WHERE name = 'projects'"
AGE_PRESENCE = "UPDATE suzumio.projector_presence SET seen_at = now() - interval '1 hour'"


async def _a_later_release_stands_by(database_url: str) -> None:
    """A projector of `ProjectsV2`'s release says it is around, as one standing by does."""
    conn = await db.connect(database_url, "test-later-release")
    try:
        await checkpoints_module.announce(conn, [ProjectsV2()])
    finally:
        await conn.close()


async def assert_equal_to_rebuild(
    nc: NATS, database_url: str, topology: Topology, projections: list[Projection]
) -> None:
    results = await verify(nc, database_url, topology, projections)
    assert [r.projection for r in results] == [p.name for p in projections]
    conn = await db.connect(database_url, "test-verify-tables")
    try:
        for p, result in zip(projections, results, strict=True):
            live = await conn.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = $1",
                live_schema(p.name),
            )
            # Every table the projection keeps is compared: a table left out of `tables`
            # would pass for equal whatever it holds.
            assert {t.table for t in result.tables} == {r["table_name"] for r in live}, p.name
            assert result.equal, result
    finally:
        await conn.close()


async def test_projections_follow_the_log_and_equal_a_rebuild(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology
) -> None:
    scenario = Scenario(seed=11)
    async with running_projector(nc, database_url, topology, store, ALL):
        await write(store, scenario.appends(600))
        await caught_up(nc, pool, topology, ALL)

    opened = len(scenario.sessions)
    assert await pool.fetchval("SELECT count(*) FROM proj_sessions.sessions") == opened
    messages = await pool.fetchval("SELECT count(*) FROM proj_sessions.messages")
    assert messages > 0
    assert await pool.fetchval("SELECT sum(message_count) FROM proj_sessions.sessions") == messages
    statuses = await pool.fetch("SELECT DISTINCT status FROM proj_activations.activations")
    assert {r["status"] for r in statuses} <= {"completed", "failed"}
    pending = await pool.fetchval(
        "SELECT count(*) FROM proj_signals.signals WHERE kind = 'custom' AND status <> 'done'"
        " AND status <> 'failed'"
    )
    assert pending == 0
    await assert_equal_to_rebuild(nc, database_url, topology, ALL)

    # And the comparison can fail: a live row the log no longer gives is seen as a difference.
    await pool.execute(
        "DELETE FROM proj_sessions.messages"
        " WHERE ctid = (SELECT ctid FROM proj_sessions.messages LIMIT 1)"
    )
    sessions = next(p for p in ALL if p.name == "sessions")
    [tampered] = await verify(nc, database_url, topology, [sessions])
    assert not tampered.equal
    assert {t.table: (t.only_live, t.only_rebuilt) for t in tampered.tables} == {
        "messages": (0, 1),
        "sessions": (0, 0),
    }


async def snapshot(pool: Pool) -> tuple[object, ...]:
    return (
        await pool.fetchval("SELECT count(*) FROM proj_sessions.messages"),
        await pool.fetchval("SELECT sum(message_count) FROM proj_sessions.sessions"),
        await pool.fetchval("SELECT count(*) FROM proj_signals.signals"),
        await pool.fetchval("SELECT count(*) FROM proj_activations.activations"),
    )


async def test_redelivered_and_replayed_events_never_apply_twice(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology
) -> None:
    async with running_projector(nc, database_url, topology, store, ALL) as projector:
        await write(store, Scenario(seed=5).appends(200))
        last = await caught_up(nc, pool, topology, ALL)
        before = await snapshot(pool)

        # Redelivery: the server sends everything again from sequence 1.
        await nc.jetstream().reset_consumer(topology.events_stream, "projector", seq=1)
        await write(store, Scenario(seed=6).appends(5))
        await caught_up(nc, pool, topology, ALL)

        # Replay straight into the apply step: the checkpoints must refuse it all.
        async with LogReader(nc, topology, start_seq=1) as reader:
            msgs = await reader.fetch()
        handles = frozenset().union(*(p.handles for p in ALL))
        entries = [
            decode_entry(m.metadata.sequence.stream, m.subject, m.headers, m.data, handles)
            for m in msgs
            if m.metadata.sequence.stream <= last
        ]
        conn = await db.connect(database_url, "test")
        try:
            parked = await projector._apply(conn, entries)
        finally:
            await conn.close()
        assert parked == []

    extra = Scenario(seed=6)
    extra_messages = sum(
        1 for a in extra.appends(5) for e in a.events if e.event_type == "session.message_appended"
    )
    after = await snapshot(pool)
    assert after[0] == before[0] + extra_messages  # type: ignore[operator]
    await assert_equal_to_rebuild(nc, database_url, topology, ALL)


async def test_an_event_of_a_newer_schema_holds_only_the_projection_that_reads_it(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology
) -> None:
    before, after = new_id(), new_id()
    await store.append(before, [ProjectCreated(name="before", owner_id="u")], 0)
    async with running_projector(nc, database_url, topology, store, ALL):
        await caught_up(nc, pool, topology, ALL)  # built: what follows is live
    held = await publish_newer_schema_event(nc, topology)
    await store.append(after, [ProjectCreated(name="after", owner_id="u")], 0)
    others = [p for p in ALL if p.name != "tool_calls"]
    for _ in range(2):  # and again after a restart: it meets the event again, and holds again
        async with running_projector(nc, database_url, topology, store, ALL):
            await caught_up(nc, pool, topology, others)
            serving = await pool.fetch(
                "SELECT name, serving FROM suzumio.projection_checkpoints ORDER BY name"
            )
        names = await pool.fetch("SELECT name FROM proj_projects.projects ORDER BY name")
        assert [r["name"] for r in names] == ["after", "before"]
        assert (await read_all(pool))["tool_calls"].position == held.seq - 1
        # Not serving while held (its tables no longer follow the log), the others serving.
        assert {r["name"]: r["serving"] for r in serving} == {p.name: p in others for p in ALL}


async def test_a_held_projection_stays_not_serving_while_the_leader_looks_again(
    nc: NATS,
    store: EventStore,
    pool: Pool,
    database_url: str,
    topology: Topology,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a projection left to a later release, the leader marks the projections serving
    every few seconds (what another release swapped in must not say so): that marked the held
    one serving again, frozen as it was — every read-your-writes wait stopped at it, and its
    readers took its tables for current."""
    monkeypatch.setattr(projector_module, "LATER_RELEASE_CHECK_SECONDS", 0.2)
    async with running_projector(nc, database_url, topology, store, ALL):
        await caught_up(nc, pool, topology, ALL)
    [swapped] = await rebuild(nc, database_url, topology, [ProjectsV2()])  # a later release's
    assert swapped.swapped
    await _a_later_release_stands_by(database_url)
    await publish_newer_schema_event(nc, topology)  # holds `tool_calls`
    serving = "SELECT serving FROM suzumio.projection_checkpoints WHERE name = $1"
    others = [p for p in ALL if p.name not in ("tool_calls", "projects")]
    async with running_projector(nc, database_url, topology, store, ALL):
        await caught_up(nc, pool, topology, others)
        await eventually(
            lambda: pool.fetchval(serving, "tool_calls"), lambda s: s is False, what="held"
        )
        await asyncio.sleep(1.0)  # looked again several times
        assert await pool.fetchval(serving, "tool_calls") is False
        assert await pool.fetchval(serving, "projects") is False  # left to the later release
        assert await pool.fetchval(serving, "sessions") is True


async def test_unknown_event_type_is_skipped_with_a_warning(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology
) -> None:
    pid = new_id()
    future_type = f"project.teleported_{new_id()[:8]}"
    envelope = {
        "id": new_id(), "type": future_type, "aggregate": "project", "aggregate_id": pid,
        "version": 2, "occurred_at": "2030-01-01T00:00:00Z", "actor": "system:future",
        "correlation_id": "c", "schema": 1, "data": {"where": "mars"},
    }  # fmt: skip
    await store.append(pid, [ProjectCreated(name="earth", owner_id="u")], 0)
    await nc.jetstream().publish(
        topology.event_subject("project", pid),
        json.dumps(envelope).encode(),
        headers={HDR_MSG_ID: envelope["id"], HDR_TYPE: future_type, HDR_VERSION: "2"},
    )
    await store.append(pid, [ProjectRenamed(name="still earth")], 2)

    with capture_logs() as logs:
        async with running_projector(nc, database_url, topology, store, ALL):
            await caught_up(nc, pool, topology, ALL)

    assert await pool.fetchval("SELECT name FROM proj_projects.projects WHERE id = $1", pid) == (
        "still earth"
    )
    warnings = [r for r in logs if r["event"] == "event.unknown_type_skipped"]
    assert [w["type"] for w in warnings] == [future_type]


class BrittleProjects(ProjectsProjection):
    """The projects projection with a bug: it cannot digest a project named 'poison'."""

    name: ClassVar[str] = "brittle"

    async def apply(self, conn: Connection, schema: str, events: Events) -> None:
        for e in events:
            if isinstance(e.data, ProjectCreated) and e.data.name == "poison":
                raise ValueError("indigestible")
        await super().apply(conn, schema, events)


class HeldProjects(ProjectsProjection):
    """The projects projection under another name, to be held by a newer-schema event."""

    name: ClassVar[str] = "heldp"


class BrittleCreations(BrittleProjects):
    """Brittle, and deaf to renames: it goes on past the one that holds `heldp`."""

    name: ClassVar[str] = "brittlec"
    handles: ClassVar[frozenset[str]] = frozenset({"project.created"})


async def test_a_hold_in_a_batch_that_rolls_back_holds_nothing(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology
) -> None:
    """One batch: a project, a rename of a newer schema (holds `heldp`), and a project that
    another projection fails on once (the batch rolls back and is retried). The retry must
    still bring `heldp` up to the event before the rename."""
    projections: list[Projection] = [HeldProjects(), BrittleCreations()]
    async with running_projector(nc, database_url, topology, store, projections):
        await caught_up(nc, pool, topology, projections)
    project = new_id()
    created = await store.append(project, [ProjectCreated(name="x", owner_id="u")], 0)
    envelope = {
        "id": new_id(), "type": "project.renamed", "aggregate": "project",
        "aggregate_id": project, "version": 2, "occurred_at": "2030-01-01T00:00:00Z",
        "actor": "system:future", "correlation_id": "c", "schema": 99, "data": {"name": "y"},
    }  # fmt: skip
    await nc.jetstream().publish(
        topology.event_subject("project", project),
        json.dumps(envelope).encode(),
        headers={HDR_MSG_ID: envelope["id"], HDR_TYPE: "project.renamed", HDR_VERSION: "2"},
    )
    await store.append(new_id(), [ProjectCreated(name="poison", owner_id="u")], 0)
    async with running_projector(nc, database_url, topology, store, projections):
        await caught_up(nc, pool, topology, projections[1:])
        held = await eventually(
            lambda: read_all(pool),
            lambda rows: rows["heldp"].position >= created.seq,
            what="heldp at the event before the rename",
        )
    assert held["heldp"].position == created.seq
    names = await pool.fetch("SELECT name FROM proj_heldp.projects")
    assert [r["name"] for r in names] == ["x"]


async def test_poison_event_is_parked_and_the_projection_moves_on(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology
) -> None:
    projections: list[Projection] = [BrittleProjects()]
    names = ["a", "poison", "b"]
    ids = [new_id() for _ in names]
    async with running_projector(nc, database_url, topology, store, projections):
        appended = [
            await store.append(i, [ProjectCreated(name=n, owner_id="u")], 0)
            for i, n in zip(ids, names, strict=True)
        ]
        await caught_up(nc, pool, topology, projections)

    rows = await pool.fetch("SELECT name FROM proj_brittle.projects ORDER BY name")
    assert [r["name"] for r in rows] == ["a", "b"]
    parked = await eventually(
        lambda: store.load("consumer", "projector-brittle"),
        lambda s: s.version == 1,
        what="parked record",
    )
    record = parked.events[0].data
    assert isinstance(record, MessageParked)
    assert record.subject == topology.event_subject("project", ids[1])
    assert record.stream_seq == appended[1].seq
    assert "indigestible" in record.error


async def test_many_poison_events_in_one_batch_are_parked_within_three_tries(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology
) -> None:
    """Each failing event counts an attempt on every try of the batch, not only the first:
    a batch of k such events was tried again ~2k times, a second each, every projection
    frozen meanwhile."""
    projections: list[Projection] = [BrittleProjects()]
    async with running_projector(nc, database_url, topology, store, projections):
        await caught_up(nc, pool, topology, projections)
    first, last = f"a-{new_id()}", f"b-{new_id()}"
    names = [first, *(["poison"] * 6), last]
    for name in names:  # stored before the projector runs again: one batch
        await store.append(new_id(), [ProjectCreated(name=name, owner_id="u")], 0)
    with capture_logs() as logs:
        async with running_projector(nc, database_url, topology, store, projections):
            await caught_up(nc, pool, topology, projections)
    retries = [r for r in logs if r["event"] == "projector.retrying_batch"]
    assert 1 <= len(retries) <= 2  # three tries in all
    rows = await pool.fetch(
        "SELECT name FROM proj_brittle.projects WHERE name = ANY($1)", [first, last]
    )
    assert sorted(r["name"] for r in rows) == [first, last]


async def test_rebuild_swaps_in_while_the_projector_runs(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology
) -> None:
    scenario = Scenario(seed=3)
    appends = scenario.appends(800)
    sessions = next(p for p in ALL if p.name == "sessions")
    async with running_projector(nc, database_url, topology, store, ALL):
        await write(store, (a for _, a in zip(range(400), appends, strict=False)))
        await caught_up(nc, pool, topology, ALL)  # the projector's own first build is done
        writing = asyncio.create_task(write(store, appends, window=8))
        [result] = await rebuild(nc, database_url, topology, [sessions])
        await writing
        await caught_up(nc, pool, topology, ALL)

    assert result.swapped
    assert result.position > 0
    rows = await read_all(pool)
    assert rows["sessions"].rebuilt_at is not None
    await assert_equal_to_rebuild(nc, database_url, topology, ALL)


class ProjectsV2(ProjectsProjection):
    version: ClassVar[int] = ProjectsProjection.version + 1

    def ddl(self, schema: str) -> str:
        return super().ddl(schema) + f"\nALTER TABLE {schema}.projects ADD COLUMN note text;"


async def test_a_new_projection_version_is_built_from_the_log(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology
) -> None:
    await write(store, Scenario(seed=9).appends(150))
    async with running_projector(nc, database_url, topology, store, [ProjectsProjection()]):
        await caught_up(nc, pool, topology, [ProjectsProjection()])
    projects = await pool.fetchval("SELECT count(*) FROM proj_projects.projects")

    async with running_projector(nc, database_url, topology, store, [ProjectsV2()]):
        await caught_up(nc, pool, topology, [ProjectsV2()])
        await store.append(new_id(), [ProjectCreated(name="after", owner_id="u")], 0)
        await caught_up(nc, pool, topology, [ProjectsV2()])

    assert (await read_all(pool))["projects"].version == ProjectsV2.version
    assert await pool.fetchval("SELECT count(*) FROM proj_projects.projects") == projects + 1
    assert await pool.fetchval("SELECT count(note) FROM proj_projects.projects") == 0
    await assert_equal_to_rebuild(nc, database_url, topology, [ProjectsV2()])


async def test_one_projector_leads_and_a_standby_takes_over(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology
) -> None:
    projections: list[Projection] = [ProjectsProjection()]
    replicas = [Projector(nc, database_url, topology, projections, store) for _ in range(2)]
    stops = [asyncio.Event(), asyncio.Event()]
    tasks = [asyncio.create_task(r.run(s)) for r, s in zip(replicas, stops, strict=True)]
    try:
        leader = await eventually(
            lambda: _leaders(replicas), lambda found: len(found) == 1, what="one leader"
        )
        await asyncio.sleep(0.5)
        assert len(await _leaders(replicas)) == 1  # the other stands by
        await store.append(new_id(), [ProjectCreated(name="one", owner_id="u")], 0)
        await caught_up(nc, pool, topology, projections)

        stops[leader[0]].set()
        await tasks[leader[0]]
        await eventually(
            lambda: _leaders(replicas), lambda found: found == [1 - leader[0]], timeout=15,
            what="the standby to take over",
        )  # fmt: skip
        await store.append(new_id(), [ProjectCreated(name="two", owner_id="u")], 0)
        await caught_up(nc, pool, topology, projections)
    finally:
        for stop in stops:
            stop.set()
        await asyncio.gather(*tasks)
    assert await pool.fetchval("SELECT count(*) FROM proj_projects.projects") == 2


async def _leaders(replicas: list[Projector]) -> list[int]:
    return [i for i, r in enumerate(replicas) if r.leading]


async def test_a_rebuild_holds_a_projection_at_an_event_of_a_newer_schema_and_builds_the_rest(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology
) -> None:
    """A newer release's event must not stop the rebuild of every projection (retried for
    ever, none swapped in): the projection that reads it is swapped in just before it, as the
    live projector holds it; the others are built to the end. The live projector then holds
    that one there and goes on with the rest."""
    before, after = new_id(), new_id()
    await store.append(before, [ProjectCreated(name="before", owner_id="u")], 0)
    held = await publish_newer_schema_event(nc, topology)
    last = await store.append(after, [ProjectCreated(name="after", owner_id="u")], 0)

    results = {r.projection: r for r in await rebuild(nc, database_url, topology, ALL)}

    assert results["tool_calls"].held_at == held.seq
    assert results["tool_calls"].position == held.seq - 1
    assert all(r.held_at is None and r.position >= last.seq for n, r in results.items()
               if n != "tool_calls")  # fmt: skip
    names = await pool.fetch("SELECT name FROM proj_projects.projects ORDER BY name")
    assert [r["name"] for r in names] == ["after", "before"]
    rows = await read_all(pool)
    assert rows["tool_calls"].position == held.seq - 1
    assert rows["projects"].position >= last.seq
    serving = await pool.fetch("SELECT name, serving FROM suzumio.projection_checkpoints")
    # Swapped in frozen at the event: not serving, or it would be taken for current until
    # the live projector's next batch (none, on an idle log).
    assert {r["name"]: r["serving"] for r in serving} == {
        p.name: p.name != "tool_calls" for p in ALL
    }
    others = [p for p in ALL if p.name != "tool_calls"]
    async with running_projector(nc, database_url, topology, store, ALL):
        await caught_up(nc, pool, topology, others)
    assert (await read_all(pool))["tool_calls"].position == held.seq - 1


class ProjectsV1(ProjectsProjection):
    version: ClassVar[int] = ProjectsProjection.version - 1


async def test_a_rebuild_by_an_earlier_release_is_built_again_by_the_running_one(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology
) -> None:
    """`suzumio projections rebuild` of an earlier release swapped in its version of a
    projection the running projector cannot apply to: the projector built it again to its
    own version and went on (it skipped it for good, and, left serving at its checkpoint,
    it held every read-your-writes wait there)."""
    await write(store, Scenario(seed=11).appends(100))
    async with running_projector(nc, database_url, topology, store, [ProjectsProjection()]):
        await caught_up(nc, pool, topology, [ProjectsProjection()])
        [elsewhere] = await rebuild(nc, database_url, topology, [ProjectsV1()])
        assert elsewhere.swapped
        await store.append(new_id(), [ProjectCreated(name="after", owner_id="u")], 0)
        await caught_up(nc, pool, topology, [ProjectsProjection()])
        names = await pool.fetch("SELECT name FROM proj_projects.projects")
    assert "after" in {r["name"] for r in names}
    assert (await read_all(pool))["projects"].version == ProjectsProjection.version
    await assert_equal_to_rebuild(nc, database_url, topology, [ProjectsProjection()])


async def test_a_rebuild_by_a_later_release_is_left_to_it_not_serving(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology
) -> None:
    """A later release's rebuild (mid-upgrade, while this release still leads): left alone for
    that release to lead on — built back here, the two would undo each other's work for as
    long as both run — and not serving, so it holds no read-your-writes wait."""
    await write(store, Scenario(seed=12).appends(100))
    async with running_projector(nc, database_url, topology, store, [ProjectsProjection()]):
        await caught_up(nc, pool, topology, [ProjectsProjection()])
        await _a_later_release_stands_by(database_url)
        [elsewhere] = await rebuild(nc, database_url, topology, [ProjectsV2()])
        assert elsewhere.swapped
        await store.append(new_id(), [ProjectCreated(name="after", owner_id="u")], 0)
        await eventually(
            lambda: pool.fetchval(SERVING),
            lambda serving: serving is False,
            what="the later release's projection not serving",
        )
        await asyncio.sleep(1.0)  # batches go by: it is not built back
        assert (await read_all(pool))["projects"].version == ProjectsV2.version


async def test_an_earlier_release_leaves_a_later_ones_projection_to_it_until_that_one_is_gone(
    nc: NATS,
    store: EventStore,
    pool: Pool,
    database_url: str,
    topology: Topology,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mid-upgrade, the earlier release's projector takes the lead back (the later one
    restarted): a projection the later release built is left to it, not serving — before,
    the earlier one built it down to its own version, and each release undid the other's
    work whenever the lead changed hands. Once no projector of the later release has been
    seen for a while (it was rolled back), the leader builds the projection down and serves
    it."""
    monkeypatch.setattr(projector_module, "LATER_RELEASE_CHECK_SECONDS", 0.2)
    await write(store, Scenario(seed=13).appends(100))
    async with running_projector(nc, database_url, topology, store, [ProjectsV2()]):
        await caught_up(nc, pool, topology, [ProjectsV2()])
    async with running_projector(nc, database_url, topology, store, [ProjectsProjection()]):
        await store.append(new_id(), [ProjectCreated(name="after", owner_id="u")], 0)
        await eventually(
            lambda: pool.fetchval(SERVING),
            lambda serving: serving is False,
            what="the later release's projection not serving",
        )
        await asyncio.sleep(1.5)  # looked at again several times: still left to it
        assert (await read_all(pool))["projects"].version == ProjectsV2.version

        await pool.execute(AGE_PRESENCE)  # the later release is gone
        await caught_up(nc, pool, topology, [ProjectsProjection()])
        await eventually(lambda: pool.fetchval(SERVING), bool, what="built down, serving")
        names = await pool.fetch("SELECT name FROM proj_projects.projects")
    assert "after" in {r["name"] for r in names}
    await assert_equal_to_rebuild(nc, database_url, topology, [ProjectsProjection()])


async def test_a_projector_says_it_is_around_while_it_leads_too(
    nc: NATS,
    store: EventStore,
    pool: Pool,
    database_url: str,
    topology: Topology,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A later release is most of the time the leader: said only while standing by, its
    presence aged while it led, and an earlier release that took the lead after it (a
    restart, a Postgres blip) took it for gone and built its projections down."""
    monkeypatch.setattr(projector_module, "ANNOUNCE_SECONDS", 0.2)
    seen = "SELECT seen_at FROM suzumio.projector_presence WHERE name = 'projects' AND version = $1"
    async with running_projector(nc, database_url, topology, store, [ProjectsV2()]) as projector:
        await caught_up(nc, pool, topology, [ProjectsV2()])
        assert projector.leading
        first = await eventually(
            lambda: pool.fetchval(seen, ProjectsV2.version),
            lambda at: at is not None,
            what="presence said",
        )
        await eventually(
            lambda: pool.fetchval(seen, ProjectsV2.version),
            lambda at: at is not None and at > first,
            what="presence said again while leading",
        )


async def test_a_projection_of_a_later_release_rolled_back_is_built_down_at_the_lead(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology
) -> None:
    """A leader that meets a later release's projection with no projector of that release
    seen for a while (rolled back) builds it down at once: left to a release that never comes
    back, it would serve no reads for good."""
    await write(store, Scenario(seed=14).appends(100))
    async with running_projector(nc, database_url, topology, store, [ProjectsV2()]):
        await caught_up(nc, pool, topology, [ProjectsV2()])
    await pool.execute(AGE_PRESENCE)
    async with running_projector(nc, database_url, topology, store, [ProjectsProjection()]):
        await caught_up(nc, pool, topology, [ProjectsProjection()])
        await eventually(lambda: pool.fetchval(SERVING), bool, what="built down, serving")


@pytest.mark.parametrize("lost", [1, 0], ids=["an_event", "the_first_event"])
async def test_a_rebuild_that_misses_an_event_in_delivery_swaps_nothing_in(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology,
    monkeypatch: pytest.MonkeyPatch, lost: int,
) -> None:  # fmt: skip
    """The replay's consumer acks nothing, so an event lost on the way (a reconnect, the
    client's pending limit overflowing) is never sent again: the rebuild stops, its tables
    are not swapped in (they would lack the event for good), and the next one is whole. The
    first one lost too: the replay took whatever came first for the log's start, and swapped
    in tables without the earliest events — the first projects, users."""
    for i in range(50):
        await store.append(new_id(), [ProjectCreated(name=f"p{i}", owner_id="u")], 0)
    fetch = LogReader.fetch
    dropped: list[int] = []

    async def losing_one(self: LogReader, timeout: float = 1.0) -> list[Msg]:
        msgs = await fetch(self, timeout)
        if not dropped and len(msgs) > 2:
            dropped.append(msgs[lost].metadata.sequence.stream)
            del msgs[lost]
        return msgs

    monkeypatch.setattr(LogReader, "fetch", losing_one)
    with pytest.raises(RebuildGapError):
        await rebuild(nc, database_url, topology, [ProjectsProjection()])
    assert dropped
    swapped = await pool.fetchval("SELECT to_regclass('proj_projects.projects')")
    assert swapped is None or not await pool.fetchval("SELECT count(*) FROM proj_projects.projects")
    monkeypatch.undo()

    await rebuild(nc, database_url, topology, [ProjectsProjection()])
    assert await pool.fetchval("SELECT count(*) FROM proj_projects.projects") == 50


async def test_a_rebuilds_swap_applies_at_most_a_batch_under_its_locks(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """What came while the log was replayed was applied inside the swap, which holds every
    checkpoint row: the live projector waited at those locks for all of it (an hour's worth
    of a busy platform), and every write's read-your-writes wait ran out meanwhile."""
    for i in range(20):
        await store.append(new_id(), [ProjectCreated(name=f"p{i}", owner_id="u")], 0)
    fetch, lock_rows, until = LogReader.fetch, checkpoints_module.lock_rows, _Replay.until
    meanwhile: list[int] = []
    in_swap: list[int] = []  # events the swap applied, under its locks

    async def busy(self: LogReader, timeout: float = 1.0) -> list[Msg]:
        if not meanwhile:  # while the replay reads, the platform writes on
            meanwhile.append(1)
            for i in range(120):
                await store.append(new_id(), [ProjectCreated(name=f"q{i}", owner_id="u")], 0)
        return await fetch(self, timeout)

    async def locking(conn: Connection, names: list[str]) -> Any:
        in_swap.append(-1)
        return await lock_rows(conn, names)

    async def counted(self: _Replay, reader: LogReader, target: int) -> None:
        before = self.position
        await until(self, reader, target)
        if in_swap:
            in_swap.append(self.position - before)

    monkeypatch.setattr(LogReader, "fetch", busy)
    monkeypatch.setattr(checkpoints_module, "lock_rows", locking)
    monkeypatch.setattr(_Replay, "until", counted)
    await rebuild(nc, database_url, topology, [ProjectsProjection()], batch=25)
    assert in_swap[0] == -1
    assert sum(in_swap[1:]) <= 25, in_swap
    assert await pool.fetchval("SELECT count(*) FROM proj_projects.projects") == 140


async def test_a_reader_of_the_live_tables_does_not_hold_a_rebuilds_swap(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The swap dropped the tables it swapped out inside its transaction: the drop waited for
    every reader still in a transaction over them, holding the checkpoints (the live
    projector) and queueing every new read behind it. The old tables now go after the commit,
    and stay for the next rebuild if a reader keeps them too long."""
    monkeypatch.setattr(rebuild_module, "DROP_OLD_WAIT_SECONDS", 0.3)
    await store.append(new_id(), [ProjectCreated(name="p0", owner_id="u")], 0)
    await rebuild(nc, database_url, topology, [ProjectsProjection()])
    await store.append(new_id(), [ProjectCreated(name="p1", owner_id="u")], 0)
    reader = await db.connect(database_url, "suzumio-test-reader")
    try:
        reading = reader.transaction()
        await reading.start()
        assert await reader.fetchval("SELECT count(*) FROM proj_projects.projects") == 1
        await asyncio.wait_for(rebuild(nc, database_url, topology, [ProjectsProjection()]), 20)
        assert await pool.fetchval("SELECT count(*) FROM proj_projects.projects") == 2
        assert await pool.fetchval("SELECT to_regnamespace('proj_projects__old')") is not None
        await reading.rollback()
    finally:
        await reader.close()
    await rebuild(nc, database_url, topology, [ProjectsProjection()])
    assert await pool.fetchval("SELECT to_regnamespace('proj_projects__old')") is None


async def test_a_failure_to_drop_the_old_tables_after_a_swap_is_logged_not_raised(
    database_url: str,
) -> None:
    """The swap has committed when the old tables go: a failure there (here a connection
    whose transaction failed) must not make the rebuild look failed, or its caller replays
    the whole log again for nothing."""
    conn = await db.connect(database_url, "suzumio-test-drop-old")
    try:
        failed = conn.transaction()
        await failed.start()
        with pytest.raises(asyncpg.DataError):
            await conn.execute("SELECT 1 / 0")
        with capture_logs() as logs:
            await rebuild_module._drop_old(conn, [ProjectsProjection()])
        await failed.rollback()
    finally:
        await conn.close()
    assert [e["event"] for e in logs] == ["projections.old_tables_drop_failed"]


async def test_the_projector_takes_a_batch_only_in_the_logs_order(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology
) -> None:
    """A batch out of order, or with one event twice and another missing, whose first and
    last sequences look right, is not applied: the projector reads again from its position."""
    project = new_id()
    await store.append(project, [ProjectCreated(name="a", owner_id="u")], 0)
    await store.append(project, [ProjectRenamed(name="b")], 1)
    await store.append(project, [ProjectRenamed(name="c")], 2)
    await store.append(new_id(), [ProjectCreated(name="other", owner_id="u")], 0)
    msgs: list[Msg] = []
    async with LogReader(nc, topology, start_seq=1) as reader:
        for _ in range(10):  # bounded: the four are there, a fetch may bring fewer
            msgs += await reader.fetch(timeout=1.0)
            if len(msgs) >= 4:
                break
    m1, m2, m3, m4 = msgs
    projector = Projector(nc, database_url, topology, [ProjectsProjection()], store)
    conn = await db.connect(database_url, "test-order")
    try:
        for batch in ([m1, m3, m2, m4], [m1, m2, m2, m4]):
            projector._next = m1.metadata.sequence.stream
            with pytest.raises(_ResetError):
                await projector._handle(conn, batch)
    finally:
        await conn.close()


async def test_read_models_past_the_logs_end_stop_the_projector_and_readiness_says_so(
    nc: NATS,
    store: EventStore,
    pool: Pool,
    database_url: str,
    topology: Topology,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The log's storage lost (or replaced) while Postgres kept the read models: the new
    events' sequences are at or below the checkpoints, and the projector skipped them all,
    its lag read 0 and every service ready. It stops instead, readiness says why, and it goes
    on once the log holds the checkpoints again."""
    monkeypatch.setattr(projector_module, "LOG_BEHIND_RETRY_SECONDS", 0.2)
    async with running_projector(nc, database_url, topology, store, ALL):
        await write(store, Scenario(seed=9).appends(20))
        last = await caught_up(nc, pool, topology, ALL)
    await pool.execute("UPDATE suzumio.projection_checkpoints SET position = position + 1000")
    readiness = Readiness("test", nc, pool, topology)
    with capture_logs() as logs:
        async with running_projector(nc, database_url, topology, store, ALL) as projector:
            await eventually(
                lambda: asyncio.sleep(0, logs),
                lambda seen: any(e["event"] == "projector.log_behind_checkpoints" for e in seen),
                what="the projector saying the log is behind",
            )
            ready, report = await readiness.check()
            assert not ready
            assert report["checks"]["log_holds_checkpoints"] is False
            assert set(report["checkpoints_past_the_log"]) >= {p.name for p in ALL}
            assert not projector.leading
            # The log restored (here: the checkpoints brought back to where it ends).
            await pool.execute(
                "UPDATE suzumio.projection_checkpoints SET position = position - 1000"
            )
            await write(store, Scenario(seed=10).appends(5))
            assert await caught_up(nc, pool, topology, ALL) > last
    ready, report = await readiness.check()
    assert report["checks"]["log_holds_checkpoints"] is True


class StaleThenFresh:
    """A log reader whose first messages were delivered before the log grew (left over from
    an earlier fetch): they say nothing was pending then."""

    def __init__(self, target: int, stale: int) -> None:
        self.batches = [
            [self._msg(s, pending=0) for s in range(1, stale + 1)],
            [self._msg(s, pending=target - s) for s in range(stale + 1, target + 1)],
        ]
        self.delivered: list[int] = []

    @staticmethod
    def _msg(seq: int, pending: int) -> Any:
        metadata = SimpleNamespace(sequence=SimpleNamespace(stream=seq), num_pending=pending)
        headers = {HDR_TYPE: "session.opened"}  # a type nothing here reads: not decoded
        subject = "ev.session.s1"
        return SimpleNamespace(metadata=metadata, subject=subject, headers=headers, data=b"")

    async def fetch(self, timeout: float = 1.0) -> list[Any]:  # noqa: ARG002
        batch = self.batches.pop(0) if self.batches else []
        self.delivered += [m.metadata.sequence.stream for m in batch]
        return batch


async def test_a_rebuild_replays_up_to_the_log_end_though_a_stale_message_said_none_pending(
    database_url: str,
) -> None:
    """Messages delivered before the log grew came to the rebuild after it read the log's
    end: their `num_pending` of 0 made it take the end as reached and swap in without the
    events between — a projection missing them for good (a fresh stack's admin key, its
    gateway answering 401 for ever)."""
    conn = await db.connect(database_url, "test")
    try:
        replay = _Replay(conn, [], {})
        reader = StaleThenFresh(target=10, stale=4)
        await asyncio.wait_for(replay.until(reader, 10), 30)  # type: ignore[arg-type]
    finally:
        await conn.close()
    assert reader.delivered == list(range(1, 11))
    assert replay.position == 10
