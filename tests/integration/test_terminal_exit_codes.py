"""Every terminal event carries the sandbox's exit code (DESIGN §8: "with exit code and
reason"), and the activations read model shows it whichever way the activation ended — on real
NATS and Postgres."""

from __future__ import annotations

import pytest
from nats.aio.client import Client as NATS

from suzumio.contracts.envelope import DomainEvent, EventMeta
from suzumio.contracts.events import (
    ActivationCancelled,
    ActivationCompleted,
    ActivationFailed,
    ActivationRequested,
    ActivationTimedOut,
    SessionOpened,
)
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.db.pool import Pool
from suzumio.platform.projections import load_projections
from tests.integration.projector_support import caught_up, running_projector

ALL = load_projections()
META = EventMeta(actor="system:test")


@pytest.mark.parametrize(
    ("end", "status"),
    [
        (ActivationCompleted(text="done", exit_code=0), "completed"),
        (ActivationFailed(reason="runner exit 3: no output", exit_code=3), "failed"),
        (ActivationCancelled(reason="by the user", exit_code=9), "cancelled"),
        (ActivationTimedOut(timeout_seconds=5, exit_code=9), "timed_out"),
    ],
)
async def test_the_read_model_shows_the_exit_code_of_every_terminal_kind(
    nc: NATS,
    store: EventStore,
    pool: Pool,
    database_url: str,
    topology: Topology,
    end: DomainEvent,
    status: str,
) -> None:
    project_id, agent_id, session_id, activation_id = new_id(), new_id(), new_id(), new_id()
    requested = ActivationRequested(
        activation_id=activation_id, agent_id=agent_id, signal_ids=(), project_id=project_id
    )
    opened = SessionOpened(project_id=project_id, agent_id=agent_id)
    async with running_projector(nc, database_url, topology, store, ALL):
        await store.append(session_id, [opened, requested], 0, META)
        await store.append(activation_id, [end], 0, META)
        await caught_up(nc, pool, topology, ALL)
    row = await pool.fetchrow(
        "SELECT status, exit_code FROM proj_activations.activations WHERE id = $1", activation_id
    )
    assert row is not None
    assert (row["status"], row["exit_code"]) == (status, end.exit_code)  # type: ignore[attr-defined]


def test_a_stored_terminal_event_without_an_exit_code_still_reads() -> None:
    """Events stored before the field existed: no exit code, not an error."""
    assert ActivationCompleted.model_validate({"text": "old"}).exit_code is None
    assert ActivationCancelled.model_validate({"reason": "old"}).exit_code is None
    assert ActivationTimedOut.model_validate({"timeout_seconds": 3}).exit_code is None
