"""Test support for the scheduler: a stand-in launcher that plays the orchestrator, and an
auditor that reads the log back and checks the scheduling invariants."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Self, TypeVar

from nats.aio.client import Client as NATS

from suzumio.contracts.envelope import DomainEvent, EventMeta, decode_data
from suzumio.contracts.events import (
    ActivationCancelled,
    ActivationCancelRequested,
    ActivationCompleted,
    ActivationFailed,
    ActivationRequested,
    ActivationStarted,
    AgentCreated,
    ProjectCreated,
    SessionOpened,
    SignalClosed,
    SignalRecorded,
    SignalsDelivered,
)
from suzumio.contracts.events.activation import TERMINAL_ACTIVATION_EVENTS
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.contracts.values import ModelSpec, Priority, ProjectLimits, SignalKind
from suzumio.platform.bus.eventstore import EventStore, envelopes_of
from suzumio.platform.bus.follower import LogFollower

Outcome = Literal["complete", "idle", "fail", "hang"]  # idle: completes with no effect
E = TypeVar("E", bound=DomainEvent)
Behaviour = Callable[[ActivationRequested], Awaitable[Outcome]]


async def quick(_: ActivationRequested) -> Outcome:
    return "complete"


@dataclass
class Requested:
    session_id: str
    event: ActivationRequested


class StandInLauncher:
    """Plays the orchestrator until it exists: every requested activation is started and then
    ends as `behaviour` says; a cancel request ends it as cancelled."""

    def __init__(
        self,
        nc: NATS,
        topology: Topology,
        store: EventStore,
        behaviour: Behaviour = quick,
        *,
        lean: bool = False,
    ) -> None:
        self._lean = lean  # started and completed in one append, at once (for benchmarks)
        self._store = store
        self._follower = LogFollower(nc, topology)
        self._behaviour = behaviour
        self.requested: list[Requested] = []
        self.cancel_requests: list[str] = []
        self._running: dict[str, asyncio.Task[None]] = {}
        self._ended: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        await self._follower.start()
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        for task in self._running.values():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._follower.close()

    async def _loop(self) -> None:
        while True:
            msg = await self._follower.next()
            if msg is None or msg.subject.split(".")[-2] != "session":
                continue
            for envelope in envelopes_of(msg.data):
                data = decode_data(envelope)
                if isinstance(data, ActivationRequested):
                    self.requested.append(Requested(envelope.aggregate_id, data))
                    work = self._complete_now(data) if self._lean else self._run(data)
                    self._running[data.activation_id] = asyncio.create_task(work)
                elif isinstance(data, ActivationCancelRequested):
                    self.cancel_requests.append(data.activation_id)
                    if self._finish(data.activation_id):
                        await self._append(
                            data.activation_id, ActivationCancelled(reason=data.reason)
                        )

    def _finish(self, activation_id: str) -> bool:
        """Whether this end is the activation's first (exactly one terminal event)."""
        if activation_id in self._ended:
            return False
        self._ended.add(activation_id)
        task = self._running.pop(activation_id, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        return True

    async def _complete_now(self, request: ActivationRequested) -> None:
        if self._finish(request.activation_id):
            started = ActivationStarted(
                session_id="session", project_id="project", agent_id="agent", backend="stand-in"
            )
            await self._store.append(
                request.activation_id, [started, ActivationCompleted(text="done")], 0
            )

    async def _run(self, request: ActivationRequested) -> None:
        started = ActivationStarted(
            session_id="session",
            project_id="project",
            agent_id=request.agent_id,
            backend="stand-in",
        )
        await self._append(request.activation_id, started)
        outcome = await self._behaviour(request)
        if outcome == "hang" or not self._finish(request.activation_id):
            return
        endings: dict[str, DomainEvent] = {
            "complete": ActivationCompleted(text="done"),
            "idle": ActivationCompleted(text=""),
            "fail": ActivationFailed(reason="stand-in failure"),
        }
        ending = endings[outcome]
        await self._append(request.activation_id, ending)

    async def _append(self, activation_id: str, event: DomainEvent) -> None:
        await self._store.append_next(activation_id, [event], EventMeta(actor="system:stand-in"))


@dataclass
class Audit:
    """What the log says happened, and every breach of the scheduling invariants."""

    violations: list[str] = field(default_factory=list)
    delivered_to: dict[str, list[str]] = field(default_factory=dict)  # signal -> activations
    outcome_of: dict[str, str] = field(default_factory=dict)  # activation -> terminal type
    closed_failed: set[str] = field(default_factory=set)
    recorded: set[str] = field(default_factory=set)
    requested: int = 0

    def completed_deliveries(self, signal_id: str) -> list[str]:
        return [
            a
            for a in self.delivered_to.get(signal_id, [])
            if self.outcome_of.get(a) == "activation.completed"
        ]


async def audit(nc: NATS, topology: Topology) -> Audit:
    """Read the whole log and check: at most one live activation per session at any point,
    signals delivered only while pending or to their activation's successor."""
    result = Audit()
    live: dict[str, str] = {}  # session -> live activation
    session_of: dict[str, str] = {}
    follower = LogFollower(nc, topology)
    end = await follower.start()
    try:
        seq = 0
        while seq < end:
            msg = await follower.next(timeout=10)
            assert msg is not None, "the log stopped short"
            seq = msg.seq
            for envelope in envelopes_of(msg.data):
                data = decode_data(envelope)
                aggregate_id = envelope.aggregate_id
                match data:
                    case SignalRecorded():
                        result.recorded.add(data.signal_id)
                    case ActivationCancelRequested():
                        if live.get(aggregate_id) == data.activation_id:
                            del live[aggregate_id]
                    case ActivationRequested():
                        result.requested += 1
                        if aggregate_id in live:
                            result.violations.append(
                                f"{aggregate_id}: {data.activation_id} requested while "
                                f"{live[aggregate_id]} is live"
                            )
                        live[aggregate_id] = data.activation_id
                        session_of[data.activation_id] = aggregate_id
                    case SignalsDelivered():
                        for signal_id in data.signal_ids:
                            seen = result.delivered_to.setdefault(signal_id, [])
                            if data.activation_id not in seen:
                                seen.append(data.activation_id)
                    case SignalClosed():
                        result.closed_failed.add(data.signal_id)
                    case _ if envelope.type in TERMINAL_ACTIVATION_EVENTS:
                        result.outcome_of[aggregate_id] = envelope.type
                        session_id = session_of.get(aggregate_id)
                        if session_id is not None and live.get(session_id) == aggregate_id:
                            del live[session_id]
    finally:
        await follower.close()
    return result


class Sessions:
    """Projects, agents and sessions written straight to the log, as the session service
    would: the scheduler reads only events."""

    def __init__(self, store: EventStore) -> None:
        self.store = store

    async def project(self, max_concurrent: int = 8) -> str:
        project_id = new_id()
        limits = ProjectLimits(max_concurrent_activations=max_concurrent)
        await self.store.append(
            project_id, [ProjectCreated(name="p", owner_id="u", limits=limits)], 0
        )
        return project_id

    async def session(self, project_id: str, toolpacks: tuple[str, ...] = ()) -> str:
        agent_id, session_id = new_id(), new_id()
        agent = AgentCreated(
            project_id=project_id,
            name="a",
            role="r",
            prompt="",
            model=ModelSpec(name="m"),
            toolpacks=toolpacks,
        )
        await self.store.append(agent_id, [agent], 0)
        await self.store.append(
            session_id, [SessionOpened(project_id=project_id, agent_id=agent_id)], 0
        )
        return session_id

    async def signal(
        self,
        session_id: str,
        priority: Priority = Priority.P1,
        *,
        kind: SignalKind = SignalKind.USER_MESSAGE,
        signal_id: str | None = None,
        **extra: object,
    ) -> str:
        signal_id = signal_id or new_id()
        event = SignalRecorded(
            signal_id=signal_id,
            agent_id="agent",
            kind=kind,
            priority=priority,
            **extra,  # type: ignore[arg-type]
        )
        await self.store.append_next(session_id, [event])
        return signal_id

    async def signals(self, session_id: str, specs: list[tuple[Priority, str]]) -> list[str]:
        """Several signals in one commit (as a batch arrives together)."""
        ids = [new_id() for _ in specs]
        events = [
            SignalRecorded(
                signal_id=i, agent_id="agent", kind=SignalKind.CUSTOM, priority=p, payload={"n": n}
            )
            for i, (p, n) in zip(ids, specs, strict=True)
        ]
        await self.store.append_next(session_id, events)
        return ids

    async def events(self, session_id: str, kind: type[E]) -> list[E]:
        stream = await self.store.load("session", session_id)
        return [e.data for e in stream.events if isinstance(e.data, kind)]

    async def times(self, session_id: str, kind: type[DomainEvent]) -> list[datetime]:
        stream = await self.store.load("session", session_id)
        return [e.envelope.occurred_at for e in stream.events if isinstance(e.data, kind)]


def jitter(low: float, high: float) -> float:
    return random.uniform(low, high)  # noqa: S311 - test pacing, not security
