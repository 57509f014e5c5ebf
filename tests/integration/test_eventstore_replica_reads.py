"""Reads that decide whether an append landed ask for a replica holding the log as far as
its leader has it (`min_last_seq`): with a replicated log, a Direct Get may be answered by a
follower that has not applied a write acknowledged a moment ago — and "not stored" said of
an append that was made a landed decision a conflict, or freed the capacity of a start that
took it. Real NATS (one server: the floor holds trivially; what is checked is that these
reads ask for it, and still answer right)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from nats.aio.client import Client as NATS

from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.errors import CommandTimeoutError, ConflictError
from suzumio.contracts.events import ProjectCreated, ProjectRenamed
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.eventstore import EventStore, Head
from suzumio.platform.bus.jsapi import stream_last_seq
from suzumio.platform.bus.replies import Replies
from suzumio.platform.errors import PlatformError


@pytest.fixture
def direct_gets(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The bodies of the Direct Gets made from here on."""
    seen: list[dict[str, Any]] = []
    real = Replies.request

    async def request(
        self: Replies, subject: str, payload: bytes, headers: Any, timeout: float
    ) -> Any:
        if ".DIRECT.GET." in subject:
            seen.append(json.loads(payload) if payload else {"subject": subject})
        return await real(self, subject, payload, headers, timeout)

    monkeypatch.setattr(Replies, "request", request)
    return seen


def log_end_looks(store: EventStore) -> list[bool]:
    """Each look-up of the log's end `store` makes from now on (`last_position`)."""
    looked_up: list[bool] = []
    real = store.last_position

    async def last_position() -> int:
        looked_up.append(True)
        return await real()

    store.last_position = last_position  # type: ignore[method-assign]
    return looked_up


async def test_an_append_refused_for_a_stale_version_reads_from_the_leaders_log(
    nc: NATS, topology: Topology, store: EventStore, direct_gets: list[dict[str, Any]]
) -> None:
    project = new_id()
    created = await store.append(project, [ProjectCreated(name="p", owner_id="u")], 0, EventMeta())
    await store.append(project, [ProjectRenamed(name="q")], 1, EventMeta())
    last = await stream_last_seq(nc, topology.events_stream)
    behind = EventStore(nc, topology)  # another writer, which saw version 1 last
    behind.observe("project", project, 1, created.events[0].seq)
    direct_gets.clear()
    looked_up = log_end_looks(behind)
    with pytest.raises(ConflictError) as refused:
        await behind.append(project, [ProjectRenamed(name="r")], 1, EventMeta())
    # Conflicts are routine: the floor is the one the refusal names, no stream look-up.
    assert looked_up == []
    assert refused.value.details["actual_version"] == 2
    assert direct_gets
    assert all(body.get("min_last_seq", 0) >= last for body in direct_gets)


async def test_the_head_as_the_leader_has_it(
    nc: NATS, topology: Topology, store: EventStore, direct_gets: list[dict[str, Any]]
) -> None:
    """From the stream's own API, which its leader answers: no Direct Get (which a follower
    behind may answer), and one round trip (no look-up of the log's end before it)."""
    project = new_id()
    created = await store.append(project, [ProjectCreated(name="p", owner_id="u")], 0, EventMeta())
    renamed = await store.append(project, [ProjectRenamed(name="q")], 1, EventMeta())
    reader = EventStore(nc, topology)  # nothing of it cached
    looked_up = log_end_looks(reader)
    direct_gets.clear()
    head = await reader.head("project", project, latest=True)
    assert (head.version, head.seq) == (2, renamed.events[0].seq)
    assert head.seq > created.events[0].seq
    assert direct_gets == []
    assert looked_up == []
    assert (await reader.head("project", new_id(), latest=True)) == Head(0, 0)


async def test_a_conflict_whose_head_cannot_be_read_is_trouble_not_a_refusal(
    nc: NATS, topology: Topology, store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused for a stale version, the append was not stored, but the version the subject
    is at is read from a replica holding the log to the refusal's point: one that cannot
    answer now (a follower behind, 412; a leader being elected) is trouble that passes —
    `CommandTimeoutError`, asked again — not a refusal of the append itself, which its
    writer would take as final (the orchestrator ended a completed activation as failed)."""
    project = new_id()
    created = await store.append(project, [ProjectCreated(name="p", owner_id="u")], 0, EventMeta())
    await store.append(project, [ProjectRenamed(name="q")], 1, EventMeta())
    behind = EventStore(nc, topology)
    behind.observe("project", project, 1, created.events[0].seq)
    real = Replies.request

    async def request(
        self: Replies, subject: str, payload: bytes, headers: Any, timeout: float
    ) -> Any:
        if ".DIRECT.GET." in subject and b"last_by_subj" in payload:
            raise PlatformError("direct get failed with status 412")  # a replica behind
        return await real(self, subject, payload, headers, timeout)

    monkeypatch.setattr(Replies, "request", request)
    with pytest.raises(CommandTimeoutError):
        await behind.append(project, [ProjectRenamed(name="r")], 1, EventMeta())
    monkeypatch.setattr(Replies, "request", real)
    with pytest.raises(ConflictError) as refused:  # readable again: the conflict it is
        await behind.append(project, [ProjectRenamed(name="r")], 1, EventMeta())
    assert refused.value.details["actual_version"] == 2
