"""The session service's repository on a record another writer keeps changing (the scheduler,
other replicas): it retries after short random pauses, and when every attempt met a newer
write it answers `unavailable` (send again) — never `conflict`, which tells a client retrying
with its idempotency key that its first attempt landed. Real NATS; the other writer is a
real append that lands just before each of the repository's.

And on a replicated log read from a follower behind it: a refusal or a no-op, which no
conditional append checks, is answered only on the record as the leader has it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from nats.aio.client import Client as NATS

from suzumio.contracts.envelope import DomainEvent, EventMeta
from suzumio.contracts.errors import ConflictError, UnavailableError
from suzumio.contracts.events import ProjectCreated, ProjectRenamed
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.bus.jsapi import ensure_streams
from suzumio.session.domain.project import ProjectState
from suzumio.session.repository import Repository
from tests.support import ReadsBehind


async def _raced(nc: NATS, topology: Topology, races: int) -> tuple[Repository, str, list[int]]:
    """A repository whose next `races` appends each find another writer's rename first."""
    await ensure_streams(nc, topology.streams())
    store = EventStore(nc, topology)
    project = new_id()
    await store.append(project, [ProjectCreated(name="p", owner_id="u")], 0, EventMeta())
    repo = Repository(store)
    real = store.append
    raced: list[int] = []

    async def append(aggregate_id: str, events: Any, expected: int, meta: EventMeta) -> Any:
        if len(raced) < races:
            raced.append(expected)
            head = (await store.load("project", aggregate_id)).version
            await real(aggregate_id, [ProjectRenamed(name=f"other {head}")], head, EventMeta())
        return await real(aggregate_id, events, expected, meta)

    repo.store.append = append  # type: ignore[method-assign,assignment]
    return repo, project, raced


async def test_a_record_that_keeps_changing_is_unavailable_not_a_conflict(
    nc: NATS, topology: Topology
) -> None:
    repo, project, raced = await _raced(nc, topology, races=100)
    with pytest.raises(UnavailableError, match="send it again"):
        await repo.execute(
            ProjectState, project, lambda _: [ProjectRenamed(name="mine")], EventMeta()
        )
    assert len(raced) == 6  # every attempt met a newer write


async def test_a_record_changed_a_few_times_takes_the_write_after_a_pause(
    nc: NATS, topology: Topology
) -> None:
    repo, project, raced = await _raced(nc, topology, races=3)
    state, _ = await repo.execute(
        ProjectState, project, lambda _: [ProjectRenamed(name="mine")], EventMeta()
    )
    assert len(raced) == 3
    assert state.name == "mine"


async def _renamed_behind(nc: NATS, topology: Topology) -> tuple[Repository, str]:
    """A project renamed to `q` (the write acknowledged), and a repository reading it from a
    follower that has not applied the rename."""
    await ensure_streams(nc, topology.streams())
    store = ReadsBehind(nc, topology)
    project = new_id()
    await store.append(project, [ProjectCreated(name="p", owner_id="u")], 0, EventMeta())
    await store.append(project, [ProjectRenamed(name="q")], 1, EventMeta())
    return Repository(store), project


async def test_a_refusal_on_a_record_read_behind_is_decided_again_on_the_leaders(
    nc: NATS, topology: Topology
) -> None:
    repo, project = await _renamed_behind(nc, topology)

    def once_renamed(state: Any) -> Sequence[DomainEvent]:
        if state.name != "q":
            raise ConflictError("not renamed yet")
        return [ProjectRenamed(name="r")]

    state, result = await repo.execute(ProjectState, project, once_renamed, EventMeta())
    assert isinstance(repo.store, ReadsBehind)
    assert repo.store.behind_reads >= 2
    assert state.name == "r"
    assert [e.version for e in result.events] == [3]


async def test_a_no_op_on_a_record_read_behind_is_decided_again_on_the_leaders(
    nc: NATS, topology: Topology
) -> None:
    """Renaming back to `p` looks done on the follower; the leader has it `q`."""
    repo, project = await _renamed_behind(nc, topology)

    def named_p(state: Any) -> Sequence[DomainEvent]:
        return [] if state.name == "p" else [ProjectRenamed(name="p")]

    state, _ = await repo.execute(ProjectState, project, named_p, EventMeta())
    assert state.name == "p"
    stored = await EventStore(nc, topology).load("project", project)  # as the leader has it
    assert [e.data.name for e in stored.events[1:]] == ["q", "p"]  # type: ignore[attr-defined]


async def test_a_refusal_read_behind_on_the_last_attempt_is_unavailable(
    nc: NATS, topology: Topology
) -> None:
    """Every attempt but the last met a newer write; the last read a refusal from a follower
    behind, which the leader's record does not confirm. No answer was decided: `unavailable`
    (send again) — it ran off the end of its attempts into an `internal` error, which a
    client's Idempotency-Key kept and replayed for a day."""
    await ensure_streams(nc, topology.streams())
    store = ReadsBehind(nc, topology)
    project = new_id()
    await store.append(project, [ProjectCreated(name="p", owner_id="u")], 0, EventMeta())
    repo = Repository(store)
    decided: list[int] = []

    def refused_last(state: Any) -> Sequence[DomainEvent]:
        decided.append(state.version)
        if len(decided) < 6:  # each append meets the write the follower has not shown yet
            return [ProjectRenamed(name=f"mine {len(decided)}")]
        raise ConflictError("refused on what it read")

    with pytest.raises(UnavailableError, match="send it again"):
        await repo.execute(ProjectState, project, refused_last, EventMeta())
    assert len(decided) == 6
