"""Read models under odd but storable logs, on real NATS and Postgres: instants written
without a timezone (before the API refused them) or beyond what Python holds once in UTC, an
activation's start stored after its end (the orchestrator appends the start at whatever head
the subject has), and audit records carrying NUL. Each row is what the log means, live as
after a rebuild, and no event is parked over it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from nats.aio.client import Client as NATS

from suzumio.contracts.envelope import DomainEvent, EventMeta
from suzumio.contracts.events import (
    ActivationCompleted,
    ActivationRequested,
    ActivationStarted,
    ApiKeyCreated,
    PendingActionCreated,
    SessionOpened,
    SignalRecorded,
    ToolCallFinished,
    ToolCallStarted,
    UserCreated,
)
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.contracts.values import LATEST, PendingKind, Priority, SignalKind
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.db.pool import Pool
from suzumio.platform.projections import load_projections
from suzumio.platform.projections.verify import verify
from tests.integration.projector_support import caught_up, running_projector

ALL = load_projections()
META = EventMeta(actor="system:test")
DIGEST = "0" * 64
MICROSECOND = timedelta(microseconds=1)
KEPT_LATEST = datetime.max.replace(tzinfo=UTC) - MICROSECOND
KEPT_EARLIEST = datetime.min.replace(tzinfo=UTC) + MICROSECOND


@pytest.fixture
def far_from_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The projector's host runs on a timezone other than UTC."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _signal(agent_id: str, not_before: str) -> SignalRecorded:
    return SignalRecorded.model_validate(
        {
            "signal_id": new_id(),
            "agent_id": agent_id,
            "kind": SignalKind.TIMER,
            "priority": Priority.P3,
            "not_before": not_before,
        }
    )


async def _assert_rebuild_equal(
    nc: NATS, pool: Pool, database_url: str, topology: Topology
) -> None:
    await caught_up(nc, pool, topology, ALL)
    for result in await verify(nc, database_url, topology, ALL):
        assert result.equal, result


@pytest.mark.usefixtures("far_from_utc")
async def test_instants_without_a_timezone_are_read_as_utc(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology
) -> None:
    """As the scheduler reads them (tests/unit/test_scheduler_naive_times.py): not as the
    projector host's local time, which would also make a rebuild elsewhere differ."""
    project_id, agent_id, session_id = new_id(), new_id(), new_id()
    user_id, action_id = new_id(), new_id()
    naive = "2030-01-01T00:00:00"
    meant = datetime(2030, 1, 1, tzinfo=UTC)
    signal = _signal(agent_id, naive)
    assert signal.not_before is not None
    assert signal.not_before.tzinfo is None
    key = ApiKeyCreated.model_validate(
        {"key_id": "abcdefgh1234", "digest": DIGEST, "expires_at": naive}
    )
    action = PendingActionCreated.model_validate(
        {
            "project_id": project_id,
            "session_id": session_id,
            "agent_id": agent_id,
            "kind": PendingKind.QUESTION,
            "prompt": "?",
            "expires_at": naive,
        }
    )
    async with running_projector(nc, database_url, topology, store, ALL):
        opened = SessionOpened(project_id=project_id, agent_id=agent_id)
        await store.append(session_id, [opened, signal], 0, META)
        await store.append(user_id, [UserCreated(name="u"), key], 0, META)
        await store.append(action_id, [action], 0, META)
        await caught_up(nc, pool, topology, ALL)

    not_before = await pool.fetchval(
        "SELECT not_before FROM proj_signals.signals WHERE session_id = $1 AND id = $2",
        session_id,
        signal.signal_id,
    )
    assert not_before == meant
    expires = await pool.fetchval(
        "SELECT expires_at FROM proj_users.api_keys WHERE key_id = $1", key.key_id
    )
    assert expires == meant
    deadline = await pool.fetchval(
        "SELECT expires_at FROM proj_pending_actions.pending_actions WHERE id = $1", action_id
    )
    assert deadline == meant
    await _assert_rebuild_equal(nc, pool, database_url, topology)


async def test_an_instant_beyond_the_years_python_holds_in_utc_keeps_its_row(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology
) -> None:
    """9999-12-31T23:00-05:00 is a valid datetime, but not once in UTC: the driver's
    conversion fails, and the signal (or the API key) was parked, missing from the read
    model. It stands at the latest instant kept: not before then, i.e. never."""
    project_id, agent_id, session_id, user_id = new_id(), new_id(), new_id(), new_id()
    late = _signal(agent_id, "9999-12-31T23:00:00-05:00")
    early = _signal(agent_id, "0001-01-01T00:00:00+05:00")
    key = ApiKeyCreated.model_validate(
        {"key_id": "abcdefgh5678", "digest": DIGEST, "expires_at": "9999-12-31T23:00:00-05:00"}
    )
    async with running_projector(nc, database_url, topology, store, ALL):
        opened = SessionOpened(project_id=project_id, agent_id=agent_id)
        await store.append(session_id, [opened, late, early], 0, META)
        await store.append(user_id, [UserCreated(name="u"), key], 0, META)
        await caught_up(nc, pool, topology, ALL)

    rows = await pool.fetch(
        "SELECT id, not_before FROM proj_signals.signals WHERE session_id = $1", session_id
    )
    found = {r["id"]: r["not_before"] for r in rows}
    assert found == {late.signal_id: KEPT_LATEST, early.signal_id: KEPT_EARLIEST}
    expires = await pool.fetchval(
        "SELECT expires_at FROM proj_users.api_keys WHERE key_id = $1", key.key_id
    )
    assert expires == KEPT_LATEST
    await _assert_rebuild_equal(nc, pool, database_url, topology)


async def test_the_latest_instant_the_api_takes_comes_back_with_its_timezone(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology
) -> None:
    """`values.LATEST` (9999-12-31T23:59:59.999999Z) is a valid key expiry or `not_before`:
    asyncpg stored it as `infinity` and read it back naive, which the gateway's key check
    (`expires_at <= datetime.now(UTC)`) cannot compare (a 500 on every request with the key)
    and the API gave out without a timezone."""
    project_id, agent_id, session_id, user_id = new_id(), new_id(), new_id(), new_id()
    signal = _signal(agent_id, LATEST.isoformat())
    key = ApiKeyCreated(key_id="abcdefgh9012", digest=DIGEST, expires_at=LATEST)
    async with running_projector(nc, database_url, topology, store, ALL):
        opened = SessionOpened(project_id=project_id, agent_id=agent_id)
        await store.append(session_id, [opened, signal], 0, META)
        await store.append(user_id, [UserCreated(name="u"), key], 0, META)
        await caught_up(nc, pool, topology, ALL)

    expires = await pool.fetchval(
        "SELECT expires_at FROM proj_users.api_keys WHERE key_id = $1", key.key_id
    )
    assert expires is not None
    assert expires.tzinfo is not None
    assert expires > datetime.now(UTC)  # comparable with the clock: the key works
    not_before = await pool.fetchval(
        "SELECT not_before FROM proj_signals.signals WHERE session_id = $1", session_id
    )
    assert not_before == KEPT_LATEST
    assert not_before.tzinfo is not None
    await _assert_rebuild_equal(nc, pool, database_url, topology)


def _requested(activation_id: str, agent_id: str, project_id: str) -> ActivationRequested:
    return ActivationRequested(
        activation_id=activation_id, agent_id=agent_id, signal_ids=(), project_id=project_id
    )


def _started(session_id: str, project_id: str, agent_id: str) -> ActivationStarted:
    return ActivationStarted(
        session_id=session_id,
        project_id=project_id,
        agent_id=agent_id,
        backend="process",
        sandbox_id="sbx-1",
    )


@pytest.mark.parametrize("one_batch", [False, True])
async def test_a_start_stored_after_the_end_does_not_revive_the_activation(
    nc: NATS,
    store: EventStore,
    pool: Pool,
    database_url: str,
    topology: Topology,
    one_batch: bool,
) -> None:
    """The orchestrator appends `activation.started` at whatever version the subject has
    (`append_next`): a replica that launched and lost the lead meanwhile can store it after
    the new leader stored the end. The row stays ended (not `running` for ever), and still
    learns where the activation ran."""
    project_id, agent_id, session_id, activation_id = new_id(), new_id(), new_id(), new_id()
    opened = SessionOpened(project_id=project_id, agent_id=agent_id)
    writes: list[tuple[str, list[DomainEvent], int]] = [
        (session_id, [opened, _requested(activation_id, agent_id, project_id)], 0),
        (activation_id, [ActivationCompleted(text="done")], 0),
        (activation_id, [_started(session_id, project_id, agent_id)], 1),
    ]
    if one_batch:
        for aggregate_id, events, version in writes:
            await store.append(aggregate_id, events, version, META)
        async with running_projector(nc, database_url, topology, store, ALL):
            await caught_up(nc, pool, topology, ALL)
    else:
        async with running_projector(nc, database_url, topology, store, ALL):
            for aggregate_id, events, version in writes:
                await store.append(aggregate_id, events, version, META)
                await caught_up(nc, pool, topology, ALL)

    row = await pool.fetchrow(
        "SELECT * FROM proj_activations.activations WHERE id = $1", activation_id
    )
    assert row is not None
    assert row["status"] == "completed"
    assert row["output_text"] == "done"
    assert row["ended_at"] is not None
    assert (row["backend"], row["sandbox_id"]) == ("process", "sbx-1")
    await _assert_rebuild_equal(nc, pool, database_url, topology)


async def test_a_start_before_the_end_still_runs_then_ends(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology
) -> None:
    project_id, agent_id, session_id, activation_id = new_id(), new_id(), new_id(), new_id()
    opened = SessionOpened(project_id=project_id, agent_id=agent_id)
    async with running_projector(nc, database_url, topology, store, ALL):
        await store.append(
            session_id, [opened, _requested(activation_id, agent_id, project_id)], 0, META
        )
        await store.append(activation_id, [_started(session_id, project_id, agent_id)], 0, META)
        await caught_up(nc, pool, topology, ALL)
        status = await pool.fetchval(
            "SELECT status FROM proj_activations.activations WHERE id = $1", activation_id
        )
        assert status == "running"
        await store.append(activation_id, [ActivationCompleted(text="ok")], 1, META)
        await caught_up(nc, pool, topology, ALL)
    status = await pool.fetchval(
        "SELECT status FROM proj_activations.activations WHERE id = $1", activation_id
    )
    assert status == "completed"
    await _assert_rebuild_equal(nc, pool, database_url, topology)


async def test_audit_records_with_nul_keep_their_row(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology
) -> None:
    """The events' fields are plain strings: NUL is replaced as in every other read model,
    rather than the record being parked (a call missing from the audit)."""
    activation_id = new_id()
    started = ToolCallStarted(
        call_id="c\x001", tool="shell\x00exec", arguments_digest=DIGEST, arguments_size=1
    )
    finished = ToolCallFinished(call_id="c\x001", status="error", duration_ms=5, error="bad\x00")
    async with running_projector(nc, database_url, topology, store, ALL):
        await store.append(activation_id, [started], 0, META)
        await caught_up(nc, pool, topology, ALL)
        await store.append(activation_id, [finished], 1, META)
        await caught_up(nc, pool, topology, ALL)
    rows = await pool.fetch(
        "SELECT call_id, tool, status, error FROM proj_tool_calls.tool_calls"
        " WHERE activation_id = $1",
        activation_id,
    )
    assert [tuple(r) for r in rows] == [("c\ufffd1", "shell\ufffdexec", "error", "bad\ufffd")]
    await _assert_rebuild_equal(nc, pool, database_url, topology)
