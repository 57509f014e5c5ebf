"""Waiting for a person: the outcome of a pending action an activation asked for.

One subscription on the pending actions' event subjects serves every waiting request. A
waiter registers before the pending action is created, so an answer can never slip between
"created" and "waiting"; a retried ask (same id) reads the outcome from the log instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from suzumio.contracts.broker import AskOutcome
from suzumio.contracts.envelope import DomainEvent, decode_data
from suzumio.contracts.events import (
    PendingActionAnswered,
    PendingActionCancelled,
    PendingActionExpired,
)
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.eventstore import EventStore, envelopes_of

Outcome = asyncio.Future[AskOutcome]
_ENDINGS = (PendingActionAnswered, PendingActionExpired, PendingActionCancelled)


def outcome_of(pending_action_id: str, data: DomainEvent) -> AskOutcome | None:
    match data:
        case PendingActionAnswered():
            return AskOutcome(
                pending_action_id=pending_action_id,
                status="answered",
                answer=data.answer,
                approved=data.approved,
                artifact_ids=data.artifact_ids,
            )
        case PendingActionExpired():
            return AskOutcome(pending_action_id=pending_action_id, status="expired")
        case PendingActionCancelled():
            return AskOutcome(pending_action_id=pending_action_id, status="cancelled")
    return None


class PendingWaiter:
    def __init__(self, nc: NATS, topology: Topology, store: EventStore) -> None:
        self._nc, self._topology, self._store = nc, topology, store
        self._waiting: dict[str, list[Outcome]] = {}
        self._sub: Subscription | None = None

    async def start(self) -> None:
        subject = self._topology.events_filter("pending_action")
        self._sub = await self._nc.subscribe(subject, cb=self._on_event)

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    async def _on_event(self, msg: Msg) -> None:
        _, pending_action_id = self._topology.parse_event_subject(msg.subject)
        futures = self._waiting.get(pending_action_id)
        if not futures:
            return
        for envelope in envelopes_of(msg.data):
            found = outcome_of(pending_action_id, decode_data(envelope))
            if found is not None:
                for future in futures:
                    if not future.done():
                        future.set_result(found)

    @contextlib.contextmanager
    def watch(self, pending_action_id: str) -> Iterator[Outcome]:
        future: Outcome = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(pending_action_id, []).append(future)
        try:
            yield future
        finally:
            futures = self._waiting.get(pending_action_id, [])
            futures.remove(future)
            if not futures:
                self._waiting.pop(pending_action_id, None)

    async def outcome(self, pending_action_id: str, future: Outcome, wait: float) -> AskOutcome:
        if not future.done():
            stream = await self._store.load("pending_action", pending_action_id)
            for event in stream.events:
                found = outcome_of(pending_action_id, event.data)
                if found is not None:
                    return found
        if wait > 0:
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(asyncio.shield(future), wait)
        elif future.done():
            return future.result()
        return AskOutcome(pending_action_id=pending_action_id, status="pending")
