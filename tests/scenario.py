"""A deterministic, realistic stream of domain events for projection tests and benchmarks.

Projects get agents, agents get sessions, sessions get messages, signals and activations
that run to an end; some sessions close and reopen. Every append names its expected version,
so the scenario also exercises conditional appends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field

from suzumio.contracts.envelope import DomainEvent
from suzumio.contracts.events import (
    ActivationCompleted,
    ActivationFailed,
    ActivationRequested,
    ActivationStarted,
    AgentCreated,
    AgentUpdated,
    ProjectCreated,
    ProjectRenamed,
    SessionClosed,
    SessionMessageAppended,
    SessionOpened,
    SessionReopened,
    SignalClosed,
    SignalRecorded,
    SignalsDelivered,
)
from suzumio.contracts.ids import new_id
from suzumio.contracts.values import Author, ModelSpec, Priority, SignalKind, SignalOutcome
from suzumio.platform.bus.eventstore import EventStore


@dataclass(frozen=True)
class Append:
    aggregate_id: str
    events: tuple[DomainEvent, ...]
    expected_version: int
    after_previous: bool = False  # must be stored after the append before it (causality)


@dataclass
class _Session:
    id: str
    project_id: str
    agent_id: str
    version: int = 0
    open: bool = True


@dataclass
class Scenario:
    seed: int = 7
    projects: dict[str, int] = field(default_factory=dict)
    agents: dict[str, tuple[str, int]] = field(default_factory=dict)
    sessions: list[_Session] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def _groups(self, count: int) -> Iterator[list[Append]]:
        """`count` groups of appends that belong together (an activation and what follows it);
        the state moves on by whole groups only, so stopping between two is always safe."""
        rng = self._rng
        for _ in range(count):
            roll = rng.random()
            if not self.projects or roll < 0.01:
                yield [self._project(rng)]
            elif not self.agents or roll < 0.03:
                yield [self._agent(rng)]
            elif not self.sessions or roll < 0.08:
                yield [self._open_session(rng)]
            else:
                yield self._session_activity(rng)

    def appends(self, count: int) -> Iterator[Append]:
        """The appends of `count` groups (each append one to three events), in an order a real
        system could log."""
        for group in self._groups(count):
            yield from group

    def take_events(self, events: int) -> list[Append]:
        """The shortest run of whole groups that holds at least `events` events."""
        taken: list[Append] = []
        total = 0
        for group in self._groups(10**9):
            taken += group
            total += sum(len(a.events) for a in group)
            if total >= events:
                break
        return taken

    def _project(self, rng: random.Random) -> Append:
        pid = new_id()
        if self.projects and rng.random() < 0.3:
            pid = rng.choice(list(self.projects))
            version = self.projects[pid]
            self.projects[pid] = version + 1
            return Append(pid, (ProjectRenamed(name=f"renamed-{rng.randrange(1000)}"),), version)
        self.projects[pid] = 1
        return Append(
            pid, (ProjectCreated(name=f"project-{len(self.projects)}", owner_id="u1"),), 0
        )

    def _agent(self, rng: random.Random) -> Append:
        if self.agents and rng.random() < 0.3:
            aid = rng.choice(list(self.agents))
            pid, version = self.agents[aid]
            self.agents[aid] = (pid, version + 1)
            return Append(aid, (AgentUpdated(prompt=f"prompt v{version + 1}"),), version)
        aid = new_id()
        pid = rng.choice(list(self.projects))
        self.agents[aid] = (pid, 1)
        created = AgentCreated(
            project_id=pid,
            name=f"agent-{len(self.agents)}",
            role="helper",
            prompt="be useful",
            model=ModelSpec(name="demo"),
            tools=("file.read",),
        )
        return Append(aid, (created,), 0)

    def _open_session(self, rng: random.Random) -> Append:
        aid = rng.choice(list(self.agents))
        session = _Session(new_id(), self.agents[aid][0], aid)
        self.sessions.append(session)
        return self._on(session, SessionOpened(project_id=session.project_id, agent_id=aid))

    def _on(self, session: _Session, *events: DomainEvent) -> Append:
        expected = session.version
        session.version += len(events)
        return Append(session.id, events, expected)

    def _session_activity(self, rng: random.Random) -> list[Append]:
        session = rng.choice(self.sessions[-200:])
        if not session.open:
            session.open = True
            return [self._on(session, SessionReopened())]
        roll = rng.random()
        if roll < 0.02:
            session.open = False
            return [self._on(session, SessionClosed(reason="done"))]
        if roll < 0.6:
            message = SessionMessageAppended(
                message_id=new_id(),
                author=Author(kind="user", id="u1"),
                role="user",
                text=f"message {rng.randrange(10**6)} " + "x" * rng.randrange(200),
            )
            signal = SignalRecorded(
                signal_id=new_id(),
                agent_id=session.agent_id,
                kind=SignalKind.USER_MESSAGE,
                priority=rng.choice(list(Priority)),
                message_id=message.message_id,
            )
            return [self._on(session, message, signal)]
        return self._activation(rng, session)

    def _activation(self, rng: random.Random, session: _Session) -> list[Append]:
        activation_id, signal_id = new_id(), new_id()
        agent_id = session.agent_id
        request = self._on(
            session,
            SignalRecorded(
                signal_id=signal_id, agent_id=agent_id, kind=SignalKind.CUSTOM, priority=Priority.P3
            ),
            ActivationRequested(
                activation_id=activation_id, agent_id=agent_id, signal_ids=(signal_id,)
            ),
            SignalsDelivered(activation_id=activation_id, signal_ids=(signal_id,)),
        )
        started = ActivationStarted(
            session_id=session.id,
            project_id=session.project_id,
            agent_id=agent_id,
            backend="process",
        )
        ok = rng.random() < 0.8
        end: DomainEvent = (
            ActivationCompleted(text="ok", usage={"tokens": rng.randrange(1000)})
            if ok
            else ActivationFailed(reason="exit 1", exit_code=1)
        )
        outcome = SignalOutcome.DONE if ok else SignalOutcome.FAILED
        closed = self._on(session, SignalClosed(signal_id=signal_id, outcome=outcome))
        return [
            request,
            Append(activation_id, (started, end), 0, after_previous=True),
            dataclasses.replace(closed, after_previous=True),
        ]


async def write(
    store: EventStore, appends: Iterable[Append] | AsyncIterable[Append], *, window: int = 64
) -> int:
    """Append everything, pipelining independent appends; returns the number of events."""
    slots = asyncio.Semaphore(window)
    tails: dict[str, asyncio.Task[None]] = {}
    previous: asyncio.Task[None] | None = None
    events = 0

    async def one(append: Append, after: list[asyncio.Task[None]]) -> None:
        try:
            for task in after:
                await task
            await store.append(append.aggregate_id, append.events, append.expected_version)
        finally:
            slots.release()

    async for append in _each(appends):
        await slots.acquire()
        after = [t for t in (tails.get(append.aggregate_id),) if t is not None]
        if append.after_previous and previous is not None:
            after.append(previous)
        previous = tails[append.aggregate_id] = asyncio.create_task(one(append, after))
        events += len(append.events)
    await asyncio.gather(*tails.values())
    return events


async def _each(appends: Iterable[Append] | AsyncIterable[Append]) -> AsyncIterator[Append]:
    if isinstance(appends, AsyncIterable):
        async for append in appends:
            yield append
    else:
        for append in appends:
            yield append
