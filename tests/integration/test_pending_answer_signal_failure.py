"""An answer to a pending action is in the log once accepted: a failure to record the agent's
wake-up signal right after does not turn it into an error (the catch-up reaction records the
signal). Real NATS; the session service's handlers in this process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from nats.aio.client import Client as NATS
from nats.errors import TimeoutError as NatsTimeoutError

from suzumio.contracts.commands import AnswerPendingAction, CreatePendingAction
from suzumio.contracts.events import PendingActionAnswered, UserCreated
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.contracts.values import PendingKind
from suzumio.platform.bus.commands import CommandClient, CommandServer
from suzumio.platform.bus.eventstore import AggregateStream, EventStore, Head
from suzumio.session.handlers import build_router
from suzumio.session.handlers.base import Context
from suzumio.session.repository import Repository
from tests.scheduling import Sessions


class BlinkingStore(EventStore):
    """Fails the first read of a pending action that shows it answered, as a NATS that
    blinked just after the answer was stored would."""

    blinked = False

    async def load(
        self, aggregate: str, aggregate_id: str, *, after: Head | None = None
    ) -> AggregateStream:
        stream = await super().load(aggregate, aggregate_id, after=after)
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


async def test_an_answer_stored_is_accepted_though_its_signal_could_not_be_recorded_then(
    nc: NATS, topology: Topology, store: EventStore
) -> None:
    blinking = BlinkingStore(nc, topology)
    sessions = Sessions(store)
    await store.append("u", [UserCreated(name="u")], 0)
    session_id = await sessions.session(await sessions.project())
    action_id = new_id()
    commands = CommandClient(nc, topology)
    async with session_service(nc, topology, blinking):
        create = CreatePendingAction(
            pending_action_id=action_id,
            session_id=session_id,
            kind=PendingKind.QUESTION,
            prompt="Which?",
            timeout_seconds=600,
        )
        await commands.send(create, actor="system:toolbroker")
        answer = AnswerPendingAction(pending_action_id=action_id, answer="this one")
        reply = await commands.send(answer, actor="user:u")
    assert blinking.blinked
    assert reply.result["status"] == "answered"
    assert reply.result["signal_id"] is None  # not recorded by this request
    stored = await store.load("pending_action", action_id)
    assert reply.position == stored.seq
    assert [e.type for e in stored.events][-1] == PendingActionAnswered.event_type
