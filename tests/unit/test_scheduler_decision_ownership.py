"""A decision in flight holds its session (and, for a start, a slot of the project's capacity)
until the fold sees it; only that decision's own answer may free it. The fold may release a
hold early (a newer commit reached the session first), the session is decided on again, and
the older decision's late conflict must not free the newer one's slot: else a second session
starts beyond the project's limit. The leader runs on a store whose appends the test answers."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import pytest
from nats.aio.client import Client as NATS
from pydantic import TypeAdapter

from suzumio.contracts.envelope import DomainEvent, EventEnvelope, EventMeta, envelope_for
from suzumio.contracts.errors import CommandTimeoutError, ConflictError
from suzumio.contracts.events import (
    ActivationCompleted,
    ActivationRequested,
    AgentCreated,
    AgentUpdated,
    ProjectCreated,
    RuntimeProfileSet,
    SessionMessageAppended,
    SessionOpened,
    SignalRecorded,
)
from suzumio.contracts.subjects import DEFAULT_TOPOLOGY
from suzumio.contracts.values import (
    Author,
    Backend,
    ModelSpec,
    Priority,
    ProjectLimits,
    RuntimeProfileSpec,
    SignalKind,
)
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.eventstore import ConcurrencyConflictError, EventStore, Head
from suzumio.platform.bus.follower import LogMessage
from suzumio.platform.errors import JetStreamApiError
from suzumio.scheduler import engine
from suzumio.scheduler.domain.world import Changes
from suzumio.scheduler.engine import Scheduler
from suzumio.scheduler.hooks import Hooks
from suzumio.scheduler.settings import SchedulerSettings
from tests.unit.test_scheduling_state import T0

_COMMIT: TypeAdapter[list[EventEnvelope]] = TypeAdapter(list[EventEnvelope])


@dataclass
class Append:
    session_id: str
    events: tuple[DomainEvent, ...]
    version: int
    answer: asyncio.Future[None]

    @property
    def starts(self) -> bool:
        return any(isinstance(e, ActivationRequested) for e in self.events)


class HeldStore:
    """The store's conditional appends, each waiting until the test answers it."""

    def __init__(self) -> None:
        self.appends: list[Append] = []
        self.stored: defaultdict[str, int] = defaultdict(int)  # what `head` answers
        self.head_error: Exception | None = None
        self.head_reads = 0

    async def append(
        self,
        aggregate_id: str,
        events: Sequence[DomainEvent],
        expected_version: int,
        meta: EventMeta | None = None,
    ) -> None:
        answer = asyncio.get_running_loop().create_future()
        self.appends.append(Append(aggregate_id, tuple(events), expected_version, answer))
        await answer

    def observe(self, aggregate: str, aggregate_id: str, version: int, seq: int) -> None:
        pass

    async def head(self, aggregate: str, aggregate_id: str, *, latest: bool = False) -> Head:
        """The session's head in the log, as the test set it (`stored`) — asked for as the
        log's leader has it (a follower behind it would hide a landed start)."""
        assert aggregate == "session"
        assert latest
        self.head_reads += 1
        if self.head_error is not None:
            raise self.head_error
        return Head(self.stored[aggregate_id], 0)

    def of(self, session_id: str) -> list[Append]:
        return [a for a in self.appends if a.session_id == session_id]


class Leader:
    """A leading scheduler fed the log one commit at a time, as its fold loop would: fold,
    advance the position, decide; then its appends' tasks run."""

    def __init__(self, limit: int = 1) -> None:
        self.store = HeldStore()
        self.scheduler = Scheduler(
            cast("NATS", object()),  # never used here: the log comes from `commit`
            DEFAULT_TOPOLOGY,
            cast("EventStore", self.store),
            cast("CommandClient", object()),
            "postgresql://unused/db",
            SchedulerSettings(),
            Hooks([]),
            clock=lambda: T0,
        )
        self.scheduler.leading = True
        self.limit = ProjectLimits(max_concurrent_activations=limit)
        self.seq = 0
        self.versions: defaultdict[str, int] = defaultdict(int)
        self.signals = 0

    async def open(self) -> None:
        """Project p (the limit) with agents a and b, and their sessions x and y."""
        await self.commit("project", "p", ProjectCreated(name="p", owner_id="u", limits=self.limit))
        for agent, session_id in (("a", "x"), ("b", "y")):
            model = ModelSpec(name="m")
            created = AgentCreated(project_id="p", name=agent, role=agent, prompt="", model=model)
            await self.commit("agent", agent, created)
            await self.commit("session", session_id, SessionOpened(project_id="p", agent_id=agent))

    async def commit(self, aggregate: str, aggregate_id: str, *events: DomainEvent) -> None:
        self.seq += 1
        envelopes = []
        for event in events:
            self.versions[aggregate_id] += 1
            envelope = envelope_for(
                event,
                aggregate_id=aggregate_id,
                version=self.versions[aggregate_id],
                meta=EventMeta(),
                occurred_at=T0,
            )
            envelopes.append(envelope)
        message = LogMessage(
            self.seq,
            DEFAULT_TOPOLOGY.event_subject(aggregate, aggregate_id),
            tuple(e.type for e in envelopes),
            self.versions[aggregate_id],
            _COMMIT.dump_json(envelopes, by_alias=True),
            0,
            T0,
        )
        changes = Changes()
        self.scheduler._fold(message, changes)
        await self.scheduler.folded.advance(self.scheduler.world.position)
        self.scheduler._dirty |= changes.sessions
        self.scheduler._decide()
        await settle()

    async def signal(self, session_id: str, priority: Priority = Priority.P3) -> None:
        self.signals += 1
        agent = {"x": "a", "y": "b"}[session_id]
        await self.commit(
            "session",
            session_id,
            SignalRecorded(
                signal_id=f"sig{self.signals}",
                agent_id=agent,
                kind=SignalKind.CUSTOM,
                priority=priority,
            ),
        )

    async def user_message(self) -> None:
        """A user's message to x and its P1 signal, one commit of the session service."""
        self.signals += 1
        await self.commit(
            "session",
            "x",
            SessionMessageAppended(
                message_id=f"msg{self.signals}",
                author=Author(kind="user", id="u"),
                role="user",
                text="hi",
            ),
            SignalRecorded(
                signal_id=f"sig{self.signals}",
                agent_id="a",
                kind=SignalKind.USER_MESSAGE,
                priority=Priority.P1,
                message_id=f"msg{self.signals}",
            ),
        )

    async def land(self, append: Append) -> None:
        """The append wins: its commit is in the log, then its caller hears so."""
        assert self.versions[append.session_id] == append.version
        await self.commit("session", append.session_id, *append.events)
        append.answer.set_result(None)
        await settle()

    async def refuse(self, append: Append) -> None:
        """Someone else wrote first: the store reports the session's version in the log."""
        actual = self.versions[append.session_id]
        error = ConcurrencyConflictError("session", append.session_id, append.version, actual)
        append.answer.set_exception(error)
        await settle()

    @property
    def running(self) -> int:
        return self.scheduler.world.running_by_project["p"]


async def settle() -> None:
    """Lets the tasks the scheduler spawned (its appends, their answers) run."""
    for _ in range(10):
        await asyncio.sleep(0)


def activation_of(append: Append) -> str:
    return next(e.activation_id for e in append.events if isinstance(e, ActivationRequested))


async def test_a_late_conflict_does_not_free_the_slot_a_newer_decision_holds() -> None:
    leader = Leader(limit=1)
    await leader.open()
    await leader.signal("x")
    [first] = leader.store.of("x")  # decision #1, on x at v2
    await leader.user_message()  # ... but a user's message reached x first, at v3-v4
    [_, second] = leader.store.of("x")  # the fold saw v4: x is decided on again, at v4
    assert (first.version, second.version) == (2, 4)
    await leader.signal("y")
    assert leader.store.of("y") == []  # x's start holds the project's one slot

    await leader.refuse(first)  # decision #1's answer comes late
    await leader.signal("y")  # another pass of admission: y still waits
    assert leader.store.of("y") == []

    await leader.land(second)
    assert leader.running == 1
    assert leader.store.of("y") == []

    await leader.commit("activation", activation_of(second), ActivationCompleted(text="done"))
    assert leader.running == 0
    [y_start] = leader.store.of("y")  # the slot is free: now y starts
    assert y_start.starts
    await leader.land(y_start)
    assert leader.running == 1


async def test_a_handover_refused_late_does_not_free_a_newer_decisions_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """take_signals' append conflicts after the fold released its hold and the session was
    decided on again (its activation ended meanwhile): the newer start keeps its slot."""
    leader = Leader(limit=1)

    async def log_end(*_: object) -> int:
        return leader.seq

    monkeypatch.setattr(engine, "stream_last_seq", log_end)
    monkeypatch.setattr(engine, "HANDOVER_WAIT_SECONDS", 0.05)
    await leader.open()
    await leader.signal("x")
    [start] = leader.store.of("x")
    await leader.land(start)
    live = activation_of(start)
    await leader.user_message()  # a P1 for the live activation's next tool boundary

    handover = asyncio.create_task(leader.scheduler.take_signals("x", live, ()))
    await settle()
    [_, handing] = leader.store.of("x")
    assert not handing.starts
    await leader.user_message()  # reaches x first: the fold releases the handover's hold
    await leader.commit("activation", live, ActivationCompleted(text="done"))
    [_, _, restart] = leader.store.of("x")  # x starts again, and holds the slot
    assert restart.starts

    await leader.refuse(handing)
    with pytest.raises(ConflictError):  # its activation ended: not live any more
        await handover
    await leader.signal("y")
    assert leader.store.of("y") == []  # the restart still holds the one slot
    await leader.land(restart)
    assert leader.running == 1


async def test_a_handover_does_not_append_beside_a_decision_still_landing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """take_signals waits for the session's decision in flight; if it has not landed by then,
    it hands over nothing new (the due P1 goes at the next tool boundary) rather than append
    on the same version and take over the other decision's hold."""
    monkeypatch.setattr(engine, "HANDOVER_WAIT_SECONDS", 0.05)
    leader = Leader(limit=1)
    await leader.open()
    await leader.signal("x")
    [start] = leader.store.of("x")
    await leader.land(start)
    live = activation_of(start)
    await leader.user_message()  # a P1 due at the next tool boundary
    await leader.signal("x", Priority.P0)  # ... and a P0 that replaces the live activation
    [_, preempt] = leader.store.of("x")
    assert preempt.starts

    async with asyncio.timeout(10):  # (an append beside it would wait for an answer forever)
        assert await leader.scheduler.take_signals("x", live, ()) == []
    assert leader.store.of("x") == [start, preempt]  # no handover appended beside it
    await leader.land(preempt)
    log_ends_at(monkeypatch, leader, 0)
    with pytest.raises(ConflictError):  # replaced: fenced
        await leader.scheduler.take_signals("x", live, ())


def log_ends_at(monkeypatch: pytest.MonkeyPatch, leader: Leader, ahead: int) -> None:
    """The log's last sequence, `ahead` of what the leader folded when asked."""

    async def last_seq(nc: object, stream: str) -> int:
        return leader.seq + ahead

    monkeypatch.setattr(engine, "stream_last_seq", last_seq)


async def test_an_activation_whose_start_this_fold_has_not_reached_is_not_fenced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The orchestrator launched it from its own fold, and its runner reached a tool boundary
    before this scheduler's fold got to its start: not live here yet is no refusal (a 409
    made a healthy activation exit as fenced, to be done again). The fold is brought up to
    the log first; the activation is live there."""
    monkeypatch.setattr(engine, "HANDOVER_WAIT_SECONDS", 0.05)
    leader = Leader(limit=1)
    await leader.open()
    await leader.signal("x")
    [start] = leader.store.of("x")
    live = activation_of(start)
    log_ends_at(monkeypatch, leader, 1)  # the start is stored, not folded here yet
    asking = asyncio.create_task(leader.scheduler.take_signals("x", live, ()))
    await asyncio.sleep(0.2)
    assert not asking.done()  # waits for its fold to reach the log's end
    await leader.land(start)
    async with asyncio.timeout(10):
        assert await asking == []


def unconfirmed() -> CommandTimeoutError:
    return CommandTimeoutError("event store did not confirm the append", subject="s")


async def wait_for(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0.01)


async def test_a_start_whose_append_landed_unconfirmed_keeps_its_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The store could not confirm x's start, which is in the log all the same, and the fold
    has not shown it yet: x is not decided again, and y does not take the slot x's start
    holds (else two run in a project whose limit is one, once the fold shows x's)."""
    monkeypatch.setattr(engine, "APPEND_RETRY_SECONDS", 0.01)
    leader = Leader(limit=1)
    await leader.open()
    await leader.signal("x")
    [start] = leader.store.of("x")
    leader.store.stored["x"] = start.version + len(start.events)  # stored: its answer is lost
    start.answer.set_exception(unconfirmed())
    await wait_for(lambda: leader.store.head_reads > 0)
    await settle()

    await leader.signal("y")
    assert leader.store.of("y") == []  # x's start still holds the slot
    assert leader.store.of("x") == [start]  # and x is not decided again on a stale version

    await leader.commit("session", "x", *start.events)  # the fold reaches x's start
    assert leader.running == 1
    await leader.signal("y")
    assert leader.store.of("y") == []
    await leader.commit("activation", activation_of(start), ActivationCompleted(text="done"))
    [y_start] = leader.store.of("y")
    assert y_start.starts


async def test_a_start_whose_append_did_not_land_is_decided_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The head shows the append was not stored (after the log could not be read at first):
    the hold ends, and x is decided again on the same version."""
    monkeypatch.setattr(engine, "APPEND_RETRY_SECONDS", 0.01)
    leader = Leader(limit=1)
    await leader.open()
    await leader.signal("x")
    [start] = leader.store.of("x")
    leader.store.stored["x"] = start.version  # not stored
    leader.store.head_error = TimeoutError()  # ... and the log cannot be read for a while
    start.answer.set_exception(unconfirmed())
    await wait_for(lambda: leader.store.head_reads >= 2)
    assert leader.store.of("x") == [start]  # held while nobody can tell

    leader.store.head_error = None
    await wait_for(lambda: len(leader.store.of("x")) == 2)
    again = leader.store.of("x")[1]
    assert again.starts
    assert again.version == start.version


async def test_a_session_whose_appends_keep_being_refused_waits_longer_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server refusing every append (a stream out of space, say; no conflict): each time
    the head shows nothing stored, the session is decided again — after a pause that doubles,
    up to `APPEND_RETRY_MAX_SECONDS`, not every 0.5 s for ever (two doomed appends a second
    per session against a server in trouble). One append stored starts the count again."""
    pauses: list[float] = []

    async def noted(seconds: float) -> None:
        pauses.append(seconds)
        await asyncio.sleep(0)

    monkeypatch.setattr(engine, "_wait", noted)
    monkeypatch.setattr(engine, "APPEND_RETRY_MAX_SECONDS", 4.0)
    leader = Leader(limit=1)
    await leader.open()
    await leader.signal("x")
    for tries in range(1, 6):
        await wait_for(lambda: len(leader.store.of("x")) == tries)  # noqa: B023 - awaited here
        attempt = leader.store.of("x")[-1]
        leader.store.stored["x"] = attempt.version  # not stored
        attempt.answer.set_exception(JetStreamApiError(503, 10077, "insufficient resources"))
    await wait_for(lambda: len(leader.store.of("x")) == 6)
    assert pauses == [0.5, 1.0, 2.0, 4.0, 4.0]
    leader.store.of("x")[-1].answer.set_result(None)  # stored at last
    await wait_for(lambda: "x" not in leader.scheduler._refused)


async def test_a_message_that_is_no_commit_of_events_does_not_stop_the_fold() -> None:
    """A message on the log that is not JSON at all (a foreign writer, a bug) under a type the
    scheduler folds: said in the log and passed over; the messages after it are folded and
    decided on as ever (before, the fold loop died, and each restart died there again)."""
    leader = Leader(limit=1)
    await leader.open()
    leader.seq += 1
    leader.versions["x"] += 1
    garbage = LogMessage(
        leader.seq,
        DEFAULT_TOPOLOGY.event_subject("session", "x"),
        ("session.signal_recorded",),
        leader.versions["x"],
        b"\x00 not a commit of events",
        0,
        T0,
    )
    changes = Changes()
    leader.scheduler._fold(garbage, changes)
    assert leader.scheduler.world.position == leader.seq
    await leader.signal("x")
    [start] = leader.store.of("x")
    assert start.starts


async def waiting(leader: Leader, session_id: str, project_id: str, agent_id: str) -> None:
    """A session opened with a signal to start it."""
    await leader.commit(
        "session", session_id, SessionOpened(project_id=project_id, agent_id=agent_id)
    )
    signal = SignalRecorded(
        signal_id=session_id, agent_id=agent_id, kind=SignalKind.CUSTOM, priority=Priority.P3
    )
    await leader.commit("session", session_id, signal)


async def starts_asking_few(
    leader: Leader, monkeypatch: pytest.MonkeyPatch, prefix: str, project_id: str
) -> None:
    """Twenty sessions of agent c (in `project_id`) each start, beside the thousand waiting,
    and the decisions ask few sessions in all whether they fit."""
    asked = 0
    fits = leader.scheduler._fits

    def counting(project_id: str, session_id: str) -> bool:
        nonlocal asked
        asked += 1
        return fits(project_id, session_id)

    monkeypatch.setattr(leader.scheduler, "_fits", counting)
    for i in range(20):
        await waiting(leader, f"{prefix}{i}", project_id, "c")
    started = [a for a in leader.store.appends if a.starts and a.session_id.startswith(prefix)]
    assert len(started) == 20
    assert asked <= 100, asked
    assert leader.scheduler._admission.waiting() == 1_000


async def test_sessions_waiting_behind_a_full_projects_limit_cost_nothing_per_decision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch job: a thousand sessions of project p wait behind its limit. Each decision
    anywhere (here: another project's sessions starting one by one) must not ask each of
    them whether it fits — that held the event loop for seconds per decision at scale."""
    leader = Leader(limit=1)
    await leader.open()
    await leader.signal("x")
    [start] = leader.store.of("x")
    await leader.land(start)  # p is at its limit
    for i in range(1_000):
        await waiting(leader, f"w{i}", "p", "a")
    wide = ProjectLimits(max_concurrent_activations=100)
    await leader.commit("project", "q", ProjectCreated(name="q", owner_id="u", limits=wide))
    model = ModelSpec(name="m")
    await leader.commit(
        "agent", "c", AgentCreated(project_id="q", name="c", role="c", prompt="", model=model)
    )
    await starts_asking_few(leader, monkeypatch, "q", "q")


async def process_pool_full(monkeypatch: pytest.MonkeyPatch, limit: int) -> Leader:
    """A leader whose pool `process` (agents a and b: no runtime profile) holds one live
    activation at most, and holds it (x's)."""
    leader = Leader(limit=limit)
    monkeypatch.setattr(leader.scheduler._settings, "pool_limits", {"process": 1})
    await leader.open()
    await leader.signal("x")
    [start] = leader.store.of("x")
    await leader.land(start)
    return leader


async def gpu_profile(leader: Leader) -> None:
    """Project p's runtime profile `gpu`: the worker pool `gpu`, without a limit."""
    gpu = RuntimeProfileSpec(backend=Backend.POOL, pool="gpu")
    await leader.commit("project", "p", RuntimeProfileSet(name="gpu", spec=gpu))


async def test_sessions_waiting_behind_a_full_pool_cost_nothing_per_decision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same behind a pool's limit: a thousand sessions of a project with room wait for
    pool `process` (full); the project's sessions on another pool start one by one, and no
    decision asks the thousand whether they fit."""
    leader = await process_pool_full(monkeypatch, limit=10_000)
    for i in range(1_000):
        await waiting(leader, f"w{i}", "p", "a")
    await gpu_profile(leader)
    model = ModelSpec(name="m")
    await leader.commit(
        "agent",
        "c",
        AgentCreated(
            project_id="p", name="c", role="c", prompt="", model=model, runtime_profile="gpu"
        ),
    )
    await starts_asking_few(leader, monkeypatch, "g", "p")


async def test_a_session_waiting_on_a_full_pool_starts_when_its_agent_moves_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its agent given a runtime profile on another pool (with room) while the session waited
    behind the full one: it starts now, not when the old pool frees a slot."""
    leader = await process_pool_full(monkeypatch, limit=10)
    await waiting(leader, "w", "p", "a")
    assert leader.store.of("w") == []
    await gpu_profile(leader)
    await leader.commit("agent", "a", AgentUpdated(runtime_profile="gpu"))
    assert len(leader.store.of("w")) == 1
    assert leader.scheduler._admission.waiting() == 0


async def test_a_start_refused_by_a_conflict_gives_its_capacity_back() -> None:
    """Someone wrote to the session first: the start's hold keeps the session until the fold
    sees what they wrote, not the capacity — counted as held for good, each such conflict
    took a slot of the project (and the pool) away until a restart."""
    leader = Leader(limit=1)
    await leader.open()
    await leader.signal("x")
    [start] = leader.store.of("x")
    holds = leader.scheduler._holds
    assert holds.taken_in("p") == 1
    conflict = ConcurrencyConflictError("session", "x", start.version, start.version + 1)
    start.answer.set_exception(conflict)  # ... written before it, not folded here yet
    await settle()
    assert holds.taken_in("p") == 0
    await leader.user_message()  # what was written, folded: x is decided on again
    [_, again] = leader.store.of("x")
    assert again.starts
    assert holds.taken_in("p") == 1
    await leader.land(again)
    assert (holds.taken_in("p"), leader.running) == (0, 1)
