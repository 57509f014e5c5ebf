"""An answer to a pending action is in the log once accepted: a failure to record the agent's
wake-up signal right after does not turn it into an error (the catch-up reaction records the
signal); nor does a closed session keep its agent from hearing an action's outcome. Real
NATS; the session service's handlers in this process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import pytest
from nats.aio.client import Client as NATS
from nats.errors import TimeoutError as NatsTimeoutError

from suzumio.contracts.commands import (
    AnswerPendingAction,
    CloseSession,
    CommandAccepted,
    CreatePendingAction,
    ExpirePendingAction,
)
from suzumio.contracts.errors import ConflictError
from suzumio.contracts.events import (
    ActivationCancelRequested,
    ActivationRequested,
    PendingActionAnswered,
    PendingActionCancelled,
    PendingActionCreated,
    SessionClosed,
    SignalRecorded,
    UserCreated,
)
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.contracts.values import PendingKind
from suzumio.platform.bus.commands import CommandClient, CommandServer
from suzumio.platform.bus.eventstore import AggregateStream, EventStore, Head
from suzumio.session.domain.pending_action import OUTCOMES, resume_signal_id
from suzumio.session.handlers import build_router
from suzumio.session.handlers.base import Context
from suzumio.session.reactions import ResumeSignals
from suzumio.session.repository import Repository
from tests.scheduling import Sessions
from tests.support import ReadsBehind, eventually


class BlinkingStore(EventStore):
    """Fails the first read of a pending action that shows it answered, as a NATS that
    blinked just after the answer was stored would."""

    blinked = False

    async def load(
        self,
        aggregate: str,
        aggregate_id: str,
        *,
        after: Head | None = None,
        min_last_seq: int = 0,
    ) -> AggregateStream:
        stream = await super().load(aggregate, aggregate_id, after=after, min_last_seq=min_last_seq)
        answered = any(isinstance(e.data, PendingActionAnswered) for e in stream.events)
        if aggregate == "pending_action" and answered and not self.blinked:
            self.blinked = True
            raise NatsTimeoutError
        return stream


@asynccontextmanager
async def session_service(nc: NATS, topology: Topology, store: EventStore) -> AsyncIterator[None]:
    server = CommandServer(nc, topology, build_router(Context(Repository(store))))
    await server.start()
    try:
        yield
    finally:
        await server.drain(2)


async def a_session(store: EventStore) -> str:
    sessions = Sessions(store)
    await store.append("u", [UserCreated(name="u")], 0)
    return await sessions.session(await sessions.project())


def question(
    session_id: str, action_id: str, activation_id: str | None = None, timeout_seconds: int = 600
) -> CreatePendingAction:
    """A question of the session's agent (of `activation_id`), as the broker asks it."""
    return CreatePendingAction(
        pending_action_id=action_id,
        session_id=session_id,
        activation_id=activation_id,
        kind=PendingKind.QUESTION,
        prompt="Which?",
        timeout_seconds=timeout_seconds,
    )


async def ask(commands: CommandClient, session_id: str, timeout_seconds: int = 600) -> str:
    """A question of the session's agent; its pending action's id."""
    action_id = new_id()
    await commands.send(
        question(session_id, action_id, None, timeout_seconds), actor="system:toolbroker"
    )
    return action_id


async def answered_through_a_blink(
    nc: NATS, topology: Topology, store: EventStore, blinking: BlinkingStore
) -> tuple[str, str, CommandAccepted]:
    """A question asked and answered through a session service whose store blinks right after
    the answer is stored: the session, the action and the answer's reply."""
    session_id = await a_session(store)
    commands = CommandClient(nc, topology)
    async with session_service(nc, topology, blinking):
        action_id = await ask(commands, session_id)
        answer = AnswerPendingAction(pending_action_id=action_id, answer="this one")
        reply = await commands.send(answer, actor="user:u")
    return session_id, action_id, reply


async def test_an_answer_stored_is_accepted_though_its_signal_could_not_be_recorded_then(
    nc: NATS, topology: Topology, store: EventStore
) -> None:
    blinking = BlinkingStore(nc, topology)
    session_id, action_id, reply = await answered_through_a_blink(nc, topology, store, blinking)
    assert blinking.blinked
    assert reply.result["status"] == "answered"
    assert reply.result["signal_id"] is None  # not recorded by this request
    stored = await store.load("pending_action", action_id)
    assert reply.position == stored.seq
    assert [e.type for e in stored.events][-1] == PendingActionAnswered.event_type


async def test_an_action_expired_while_its_session_is_closed_still_wakes_the_agent(
    nc: NATS, topology: Topology, store: EventStore
) -> None:
    """The session was closed while its agent's question waited; the question expired then.
    Its outcome's signal is recorded all the same (the scheduler holds it until a reopen):
    left out, the reopened session's agent would never learn its question expired."""
    session_id = await a_session(store)
    commands = CommandClient(nc, topology)
    later = [datetime.now(UTC)]
    context = Context(Repository(store), clock=lambda: later[0])
    server = CommandServer(nc, topology, build_router(context))
    await server.start()
    try:
        action_id = await ask(commands, session_id, timeout_seconds=60)
        await commands.send(CloseSession(session_id=session_id), actor="user:u")
        later[0] += timedelta(seconds=61)
        expired = await commands.send(
            ExpirePendingAction(pending_action_id=action_id), actor="system:session"
        )
    finally:
        await server.drain(2)
    assert expired.result["status"] == "expired"
    assert expired.result["signal_id"] == resume_signal_id(action_id)
    history = await store.load("session", session_id)
    types = [e.type for e in history.events]
    assert types.index(SessionClosed.event_type) < types.index(SignalRecorded.event_type)
    signal = next(e.data for e in history.events if isinstance(e.data, SignalRecorded))
    assert signal.signal_id == resume_signal_id(action_id)
    assert signal.payload["outcome"] == "expired"


class LaggingStore(EventStore):
    """Reads a pending action as a replica that lags would, `lagging` times: without its
    outcome."""

    lagging = 2

    async def load(
        self,
        aggregate: str,
        aggregate_id: str,
        *,
        after: Head | None = None,
        min_last_seq: int = 0,
    ) -> AggregateStream:
        stream = await super().load(aggregate, aggregate_id, after=after, min_last_seq=min_last_seq)
        if aggregate != "pending_action" or self.lagging <= 0:
            return stream
        self.lagging -= 1
        behind = tuple(e for e in stream.events if e.type not in OUTCOMES)
        return AggregateStream(aggregate, aggregate_id, behind)


async def test_the_catch_up_reaction_reading_behind_its_outcome_tries_again(
    nc: NATS, topology: Topology, store: EventStore
) -> None:
    """The answer's own request could not record the wake-up signal; the catch-up reaction
    that should then reads the action without its outcome (in a cluster, a replica behind the
    message it handles may answer). It must not take that for "nothing to do" and ack: the
    message comes again, and the signal is recorded."""
    blinking = BlinkingStore(nc, topology)
    session_id, action_id, reply = await answered_through_a_blink(nc, topology, store, blinking)
    assert reply.result["signal_id"] is None  # left to the reaction

    lagging = LaggingStore(nc, topology)
    reaction = ResumeSignals(nc, topology, Repository(lagging))
    stop = asyncio.Event()
    running = asyncio.create_task(reaction.worker.run(stop))

    async def signals() -> list[str]:
        history = await store.load("session", session_id)
        return [e.data.signal_id for e in history.events if isinstance(e.data, SignalRecorded)]

    try:
        await eventually(signals, lambda ids: resume_signal_id(action_id) in ids, timeout=20)
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)
    assert lagging.lagging == 0


async def test_a_question_whose_fence_check_failed_is_checked_again_when_asked_again(
    nc: NATS, topology: Topology, store: EventStore
) -> None:
    """A create is two appends: the question, then its cancel if a cancel of its activation
    came meanwhile. When the second failed (a NATS blink), the broker asks again, takes the
    "exists already" for its retry's success — and the check must be made then, or a person
    is left a question from work that is gone (which, expired, would wake the agent)."""
    session_id = await a_session(store)
    activation_id = new_id()
    await store.append_next(
        session_id, [ActivationRequested(activation_id=activation_id, agent_id="a", signal_ids=())]
    )
    opened = (await store.load("session", session_id)).events[0].data
    action_id = new_id()
    # The first append of the first attempt, as it landed before its second failed.
    await store.append(
        action_id,
        [
            PendingActionCreated(
                project_id=opened.project_id,  # type: ignore[attr-defined]
                session_id=session_id,
                agent_id=opened.agent_id,  # type: ignore[attr-defined]
                activation_id=activation_id,
                kind=PendingKind.QUESTION,
                prompt="Which?",
                expires_at=datetime.now(UTC) + timedelta(hours=1),
            )
        ],
        0,
    )
    await store.append_next(session_id, [ActivationCancelRequested(activation_id=activation_id)])
    again = question(session_id, action_id, activation_id)
    async with session_service(nc, topology, store):
        with pytest.raises(ConflictError, match="exists already"):
            await CommandClient(nc, topology).send(again, actor="system:toolbroker")
    stored = await store.load("pending_action", action_id)
    assert [e.type for e in stored.events] == [
        PendingActionCreated.event_type,
        PendingActionCancelled.event_type,
    ]


async def test_a_question_expiring_as_its_activation_is_cancelled_wakes_no_one(
    nc: NATS, topology: Topology, store: EventStore
) -> None:
    """`expire` decides expired or cancelled on the session as it reads it. A cancel stored
    just before (read from behind it) took the activation's work: the outcome must not wake
    the agent to start it again on its own."""
    session_id = await a_session(store)
    activation_id = new_id()
    await store.append_next(
        session_id, [ActivationRequested(activation_id=activation_id, agent_id="a", signal_ids=())]
    )
    commands = CommandClient(nc, topology)
    later = [datetime.now(UTC)]
    behind = ReadsBehind(nc, topology, aggregates={"session"}, behind=0)
    context = Context(Repository(behind), clock=lambda: later[0])
    server = CommandServer(nc, topology, build_router(context))
    await server.start()
    try:
        action_id = new_id()
        create = question(session_id, action_id, activation_id, timeout_seconds=60)
        behind.behind = 0
        await commands.send(create, actor="system:toolbroker")
        cancel = ActivationCancelRequested(activation_id=activation_id, closes_work=True)
        await store.append_next(session_id, [cancel])  # a person's: the work goes with it
        later[0] += timedelta(seconds=61)
        behind.behind = 1  # the expiry's read of the session misses the cancel
        expired = await commands.send(
            ExpirePendingAction(pending_action_id=action_id), actor="system:session"
        )
    finally:
        await server.drain(2)
    assert behind.behind == 0
    assert expired.result["signal_id"] is None
    history = await store.load("session", session_id)
    assert resume_signal_id(action_id) not in [
        e.data.signal_id for e in history.events if isinstance(e.data, SignalRecorded)
    ]
