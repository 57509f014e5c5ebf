"""Ids that are unique within their session only (a signal's, a message's) on real NATS and
Postgres: the same id in two sessions gives two rows, live as after a rebuild, and no
projection parks either or stalls over it. And a batch's cut never decides which of two
rows with one key a projection keeps."""

from __future__ import annotations

import pytest
from nats.aio.client import Client as NATS

from suzumio.contracts.envelope import DomainEvent, EventMeta
from suzumio.contracts.events import (
    SessionMessageAppended,
    SessionOpened,
    SignalClosed,
    SignalRecorded,
    SignalsDelivered,
)
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.contracts.values import Author, Priority, SignalKind, SignalOutcome
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.db.pool import Pool
from suzumio.platform.projections import load_projections
from suzumio.platform.projections.verify import verify
from suzumio.platform.projections.writes import DuplicateRowError, RowChanges
from tests.integration.projector_support import caught_up, running_projector

ALL = load_projections()
SHARED_SIGNAL = "0190f0f0-0000-7000-8000-00000000beef"
SHARED_MESSAGE = "0190f0f0-0000-7000-8000-00000000cafe"


def recorded(agent_id: str) -> list[DomainEvent]:
    message = SessionMessageAppended(
        message_id=SHARED_MESSAGE, author=Author(kind="user", id="u1"), role="user", text="hi"
    )
    signal = SignalRecorded(
        signal_id=SHARED_SIGNAL,
        agent_id=agent_id,
        kind=SignalKind.USER_MESSAGE,
        priority=Priority.P2,
        message_id=SHARED_MESSAGE,
    )
    return [message, signal]


async def test_one_id_in_two_sessions_is_two_rows_live_and_rebuilt(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology
) -> None:
    agent_id, project_id = new_id(), new_id()
    a, b = new_id(), new_id()
    meta = EventMeta(actor="system:test")
    async with running_projector(nc, database_url, topology, store, ALL):
        for session_id in (a, b):
            opened = SessionOpened(project_id=project_id, agent_id=agent_id)
            await store.append(session_id, [opened, *recorded(agent_id)], 0, meta)
            await caught_up(nc, pool, topology, ALL)  # separate batches, as live traffic is
        activation = new_id()
        delivered = SignalsDelivered(activation_id=activation, signal_ids=(SHARED_SIGNAL,))
        await store.append(b, [delivered], 3, meta)
        await store.append(
            b, [SignalClosed(signal_id=SHARED_SIGNAL, outcome=SignalOutcome.DONE)], 4, meta
        )
        await caught_up(nc, pool, topology, ALL)

    signals = await pool.fetch(
        "SELECT session_id, status, activation_id FROM proj_signals.signals WHERE id = $1",
        SHARED_SIGNAL,
    )
    assert {r["session_id"]: r["status"] for r in signals} == {a: "pending", b: "done"}
    messages = await pool.fetch(
        "SELECT session_id FROM proj_sessions.messages WHERE message_id = $1", SHARED_MESSAGE
    )
    assert sorted(r["session_id"] for r in messages) == sorted([a, b])
    # A rebuild reads both sessions in one batch: the same rows.
    for result in await verify(nc, database_url, topology, ALL):
        assert result.equal, result


def test_a_second_insert_of_one_key_in_a_batch_is_refused() -> None:
    rows = RowChanges("t", ("session_id", "id"))
    rows.insert(("s1", "x"), v=1)
    rows.insert(("s2", "x"), v=2)  # another session: another row
    rows.set(("s1", "x"), v=3)  # changes fold into the insert
    with pytest.raises(DuplicateRowError):
        rows.insert(("s1", "x"), v=4)
