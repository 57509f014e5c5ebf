"""`cmd.scheduler.cancel_activation` against a real scheduler on real NATS: the cancel is the
scheduler's (the one writer of `session.activation_cancel_requested`), appended on the
session's subject conditionally, once; another project's activation is `not_found`, one that
has ended a `conflict` naming how it ended."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client as NATS

from suzumio.contracts.commands import CancelActivation, CommandAccepted
from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.errors import ConflictError, NotFoundError
from suzumio.contracts.events import (
    ActivationCancelled,
    ActivationCancelRequested,
    ActivationFailed,
    ActivationRequested,
    ActivationStarted,
    SignalClosed,
)
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.contracts.values import Priority, SignalOutcome
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.eventstore import EventStore
from suzumio.scheduler import engine as scheduler_engine
from tests.integration.test_scheduler import running
from tests.scheduling import Sessions
from tests.support import eventually

USER = "user:01JCANCELLER"
ORCHESTRATOR = EventMeta(actor="system:orchestrator")


async def requested(world: Sessions, session_id: str) -> ActivationRequested:
    found = await eventually(
        lambda: world.events(session_id, ActivationRequested), bool, what="a request"
    )
    return found[0]


async def test_a_cancel_is_appended_once_and_refused_elsewhere(
    nc: NATS, topology: Topology, store: EventStore, database_url: str, commands: CommandClient
) -> None:
    world = Sessions(store)
    project = await world.project()
    session = await world.session(project)
    async with running(nc, topology, store, database_url) as scheduler:
        await world.signal(session)
        activation = (await requested(world, session)).activation_id

        def cancel(project_id: str = project, activation_id: str = activation) -> CancelActivation:
            return CancelActivation(
                activation_id=activation_id, project_id=project_id, reason="changed my mind"
            )

        # Another project's activation, or none at all, looks the same: not found.
        with pytest.raises(NotFoundError):
            await commands.send(cancel(project_id=new_id()), actor=USER)
        with pytest.raises(NotFoundError):
            await commands.send(cancel(activation_id=new_id()), actor=USER)
        assert await world.events(session, ActivationCancelRequested) == []

        reply = await commands.send(cancel(), actor=USER)
        assert reply.result["outcome"] == "requested"
        assert reply.position > 0
        # The cancel, and the close of the activation's one signal: the work goes with it.
        written, closing = reply.events
        assert (written.type, written.aggregate_id) == (
            "session.activation_cancel_requested",
            session,
        )
        assert (closing.type, closing.aggregate_id) == ("session.signal_closed", session)
        stream = await store.load("session", session)
        last, close = stream.events[-2], stream.events[-1]
        assert isinstance(close.data, SignalClosed)
        assert close.data.outcome is SignalOutcome.CANCELLED
        [signal_id] = (await requested(world, session)).signal_ids
        assert close.data.signal_id == signal_id
        assert isinstance(last.data, ActivationCancelRequested)
        assert last.data.activation_id == activation
        assert last.data.reason == f"cancelled by {USER}: changed my mind"
        assert last.data.closes_work  # its open questions go too, not wake the agent later
        assert last.envelope.actor == USER  # who cancelled, in the audit trail

        # Again, while the orchestrator has not ended it yet: nothing more is written.
        again = await commands.send(cancel(), actor=USER)
        assert again.result["outcome"] == "already_requested"
        assert again.events == ()
        assert len(await world.events(session, ActivationCancelRequested)) == 1

        # The orchestrator ends it: a cancel now is a conflict that says how it ended.
        started = ActivationStarted(
            session_id=session, project_id=project, agent_id="agent", backend="process"
        )
        await store.append_next(activation, [started], ORCHESTRATOR)
        await store.append_next(activation, [ActivationCancelled(reason="asked")], ORCHESTRATOR)
        await eventually(
            lambda: asyncio.sleep(0, activation in scheduler.world.activations),
            lambda live: not live,
            what="the end folded",
        )
        # Its signal does not queue again (a P0's cancel would requeue it): nothing pending.
        assert signal_id not in scheduler.world.sessions[session].pending
        assert len(await world.events(session, ActivationRequested)) == 1
        with pytest.raises(ConflictError, match=r"already ended \(cancelled\)") as ended:
            await commands.send(cancel(), actor=USER)
        assert ended.value.details == {"status": "cancelled"}
        # Ended, and of another project: still not found.
        with pytest.raises(NotFoundError):
            await commands.send(cancel(project_id=new_id()), actor=USER)
        assert len(await world.events(session, ActivationCancelRequested)) == 1


async def test_a_cancel_meeting_a_concurrent_write_is_appended_on_the_new_version(
    nc: NATS, topology: Topology, store: EventStore, database_url: str, commands: CommandClient
) -> None:
    """The append is conditional on the version the scheduler saw: a message stored on the
    session at the same moment makes it re-read and append after it, not fail or overwrite."""
    world = Sessions(store)
    project = await world.project()
    session = await world.session(project)
    async with running(nc, topology, store, database_url):
        await world.signal(session)
        activation = (await requested(world, session)).activation_id
        command = CancelActivation(activation_id=activation, project_id=project)
        reply, *_ = await asyncio.gather(
            commands.send(command, actor=USER),
            *(world.signal(session, signal_id=new_id()) for _ in range(5)),
        )
        assert isinstance(reply, CommandAccepted)
        assert reply.result["outcome"] == "requested"
    cancels = await world.events(session, ActivationCancelRequested)
    assert [c.activation_id for c in cancels] == [activation]


async def test_how_an_activation_that_never_started_ended_is_told_to_no_other_project(
    nc: NATS, topology: Topology, store: EventStore, database_url: str, commands: CommandClient
) -> None:
    """Its project is known from its `started` only: one that failed before starting cannot be
    confirmed as the caller's, and is not found — not "already ended (failed)"."""
    activation = new_id()
    await store.append_next(activation, [ActivationFailed(reason="no plan")], ORCHESTRATOR)
    async with running(nc, topology, store, database_url):
        with pytest.raises(NotFoundError):
            await commands.send(
                CancelActivation(activation_id=activation, project_id=new_id()), actor=USER
            )


async def test_a_cancel_closes_every_signal_of_its_activation_a_batch_per_append(
    nc: NATS,
    topology: Topology,
    store: EventStore,
    database_url: str,
    commands: CommandClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An activation may have been handed more signals than one append holds: the cancel goes
    with a batch of closes, the rest follow a batch per append, and none is left to queue
    again. (The batch is made 1 here; it is 200.)"""
    monkeypatch.setattr(scheduler_engine, "MAX_CLOSES_PER_DECISION", 1)
    world = Sessions(store)
    project = await world.project()
    session = await world.session(project)
    async with running(nc, topology, store, database_url):
        ids = await world.signals(
            session, [(Priority.P2, "a"), (Priority.P2, "b"), (Priority.P2, "c")]
        )
        request = await requested(world, session)
        assert sorted(request.signal_ids) == sorted(ids)
        command = CancelActivation(activation_id=request.activation_id, project_id=project)
        await commands.send(command, actor=USER)
        closes = await world.events(session, SignalClosed)
    assert sorted(c.signal_id for c in closes) == sorted(ids)
    assert {c.outcome for c in closes} == {SignalOutcome.CANCELLED}
