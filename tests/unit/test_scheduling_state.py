"""The scheduler's fold of the log (retries, budgets, P0 carry-over, capacity counts), its
round-robin admission and its deadline heap."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta

from suzumio.contracts.envelope import DomainEvent, EventMeta, envelope_for
from suzumio.contracts.events import (
    ActivationCancelled,
    ActivationCancelRequested,
    ActivationCompleted,
    ActivationFailed,
    ActivationRequested,
    AgentCreated,
    ProjectCreated,
    RuntimeProfileSet,
    SessionMessageAppended,
    SessionOpened,
    SignalClosed,
    SignalRecorded,
    SignalsDelivered,
    ToolCallFinished,
    ToolCallStarted,
)
from suzumio.contracts.values import (
    Author,
    Backend,
    ModelSpec,
    Priority,
    RuntimeProfileSpec,
    SignalKind,
    SignalOutcome,
)
from suzumio.scheduler.domain.admission import Admission
from suzumio.scheduler.domain.world import Changes, RetryPolicy, World
from suzumio.scheduler.timers import Timers

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


class Log:
    """Feeds a World events as the log would: per-aggregate versions, one sequence each."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.seq = 0
        self.versions: defaultdict[str, int] = defaultdict(int)

    def append(
        self,
        aggregate_id: str,
        *events: DomainEvent,
        at: datetime = T0,
        now: datetime | None = None,
    ) -> Changes:
        """`now`: the folding scheduler's clock (None: the events' own times stand)."""
        self.seq += 1
        pairs = []
        for event in events:
            self.versions[aggregate_id] += 1
            envelope = envelope_for(
                event,
                aggregate_id=aggregate_id,
                version=self.versions[aggregate_id],
                meta=EventMeta(),
                occurred_at=at,
            )
            pairs.append((envelope, event))
        changes = Changes()
        self.world.apply(self.seq, pairs, changes, now)
        return changes


def opened(budget: int = 2) -> tuple[World, Log]:
    world = World(RetryPolicy(budget=budget, backoff_seconds=(2.0, 30.0)))
    log = Log(world)
    log.append("p", ProjectCreated(name="p", owner_id="u"))
    log.append(
        "p",
        RuntimeProfileSet(name="gpu", spec=RuntimeProfileSpec(backend=Backend.POOL, pool="gpu")),
    )
    log.append(
        "a",
        AgentCreated(
            project_id="p",
            name="helper",
            role="helper",
            prompt="",
            model=ModelSpec(name="m"),
            runtime_profile="gpu",
        ),
    )
    log.append("s", SessionOpened(project_id="p", agent_id="a"))
    return world, log


def signal(signal_id: str, priority: Priority = Priority.P1) -> SignalRecorded:
    return SignalRecorded(
        signal_id=signal_id, agent_id="a", kind=SignalKind.USER_MESSAGE, priority=priority
    )


def start(log: Log, activation_id: str, *signal_ids: str) -> None:
    log.append(
        "s",
        ActivationRequested(
            activation_id=activation_id, agent_id="a", signal_ids=signal_ids, project_id="p"
        ),
        SignalsDelivered(activation_id=activation_id, signal_ids=signal_ids),
    )


def test_a_start_takes_signals_and_capacity_in_the_agents_pool() -> None:
    world, log = opened()
    log.append("s", signal("m1"))
    start(log, "x1", "m1")
    s = world.sessions["s"]
    assert s.pending == {}
    assert s.live is not None
    assert [x.id for x in s.live.signals] == ["m1"]
    assert (world.running_by_project["p"], world.running_by_pool["gpu"]) == (1, 1)
    changes = log.append("x1", ActivationCompleted(text="done"))
    assert changes.freed
    assert world.sessions["s"].live is None  # (read again: the fold changed it)
    assert (world.running_by_project["p"], world.running_by_pool["gpu"]) == (0, 0)


def test_a_message_and_its_signal_carry_the_text_to_the_handover() -> None:
    world, log = opened()
    log.append(
        "s",
        SessionMessageAppended(
            message_id="msg", author=Author(kind="user", id="u"), role="user", text="hello"
        ),
        signal("m1").model_copy(update={"message_id": "msg"}),
    )
    assert world.sessions["s"].pending["m1"].text == "hello"


def test_failed_activations_retry_within_the_budget_then_close_the_signals() -> None:
    world, log = opened(budget=2)
    s = world.sessions["s"]
    log.append("s", signal("m1"))
    start(log, "x1", "m1")
    log.append("x1", ActivationFailed(reason="model down"), at=T0)
    assert list(s.pending) == ["m1"]
    assert s.pending["m1"].failures == 1
    assert s.backoff_until == T0 + timedelta(seconds=2)
    start(log, "x2", "m1")
    log.append("x2", ActivationFailed(reason="model down"), at=T0 + timedelta(seconds=5))
    assert s.pending == {}
    assert s.failing["m1"].reason == "model down (2 attempts)"
    assert s.backoff_until == T0 + timedelta(seconds=35)
    log.append("s", SignalClosed(signal_id="m1", outcome=SignalOutcome.FAILED, reason="x"))
    assert s.failing == {}


def test_an_end_dated_ahead_of_the_schedulers_clock_counts_as_now() -> None:
    """An event's time is its writer's clock: an orchestrator an hour ahead put off the
    failed activation's retry by that hour, and its end, first in the fold's queue of ends,
    held every later one from being forgotten until that hour had passed."""
    world, log = opened(budget=2)
    s = world.sessions["s"]
    log.append("s", signal("m1"))
    start(log, "x1", "m1")
    log.append("x1", ActivationFailed(reason="model down"), at=T0 + timedelta(hours=1), now=T0)
    assert s.backoff_until == T0 + timedelta(seconds=2)
    assert s.last_ended is not None
    assert s.last_ended.at == T0
    log.append("s2", SessionOpened(project_id="p", agent_id="a"))
    log.append("s2", signal("m2"))
    log.append(
        "s2",
        ActivationRequested(activation_id="x2", agent_id="a", signal_ids=("m2",), project_id="p"),
        SignalsDelivered(activation_id="x2", signal_ids=("m2",)),
    )
    log.append("x2", ActivationCompleted(text="done"), at=T0, now=T0)
    assert world.forget_ended(T0 + timedelta(minutes=5)) == 2
    # The events' own times stand when they are not ahead of the clock.
    log.append("s", signal("m3"))
    start(log, "x3", "m3")
    log.append("x3", ActivationFailed(reason="model down"), at=T0, now=T0 + timedelta(hours=1))
    assert s.backoff_until == T0 + timedelta(seconds=30)  # its second failure in a row


def test_a_failure_that_cannot_be_retried_fails_its_signals_at_once() -> None:
    world, log = opened(budget=5)
    log.append("s", signal("m1"))
    start(log, "x1", "m1")
    log.append("x1", ActivationFailed(reason="bad image", retryable=False))
    assert world.sessions["s"].failing["m1"].reason == "bad image"


def test_success_resets_the_backoff() -> None:
    world, log = opened()
    s = world.sessions["s"]
    log.append("s", signal("m1"))
    start(log, "x1", "m1")
    log.append("x1", ActivationFailed(reason="oops"))
    start(log, "x2", "m1")
    log.append("x2", ActivationCompleted(text="ok"))
    assert (s.consecutive_failures, s.backoff_until, s.pending) == (0, None, {})


def test_a_replaced_activation_that_ends_cancelled_queues_its_signals_again() -> None:
    world, log = opened()
    s = world.sessions["s"]
    log.append("s", signal("m1"))
    start(log, "x1", "m1")
    log.append("s", signal("stop", Priority.P0))
    log.append(
        "s",
        ActivationCancelRequested(activation_id="x1", reason="P0"),
        ActivationRequested(activation_id="x2", agent_id="a", signal_ids=("stop",), replaces="x1"),
        SignalsDelivered(activation_id="x2", signal_ids=("stop",)),
    )
    assert s.live is not None
    assert (s.live.id, [x.id for x in s.live.signals]) == ("x2", ["stop"])
    assert world.running_by_project["p"] == 2  # the old sandbox still runs until it ends
    log.append("x1", ActivationCancelled(reason="P0"))
    assert s.live.id == "x2"
    assert (list(s.pending), s.failing, s.consecutive_failures) == (["m1"], {}, 0)
    assert s.pending["m1"].failures == 0
    assert world.running_by_project["p"] == 1


def test_a_replaced_activation_that_finished_anyway_has_done_its_work() -> None:
    world, log = opened()
    s = world.sessions["s"]
    log.append("s", signal("m1"))
    start(log, "x1", "m1")
    log.append("x1", ActivationCompleted(text="done"))  # ended before the P0 was folded
    log.append("s", ActivationCancelRequested(activation_id="x1", reason="P0"))
    assert (s.pending, s.live) == ({}, None)


def test_handed_over_signals_join_the_live_activation() -> None:
    world, log = opened()
    s = world.sessions["s"]
    log.append("s", signal("m1"))
    start(log, "x1", "m1")
    log.append("s", signal("m2"))
    log.append("s", SignalsDelivered(activation_id="x1", signal_ids=("m2",)))
    assert s.live is not None
    assert ([x.id for x in s.live.signals], s.live.handed, s.pending) == (["m1", "m2"], ["m2"], {})


def test_useful_effects_are_noticed_for_the_nudge_rule() -> None:
    world, log = opened()
    s = world.sessions["s"]
    for activation_id, effect in (
        ("x1", None),
        ("x2", ToolCallFinished(call_id="c", status="ok", duration_ms=3)),
        (
            "x3",
            SessionMessageAppended(
                message_id="r",
                author=Author(kind="agent", id="a"),
                role="assistant",
                text="hi",
                activation_id="x3",  # its own entry (the session service names the writer)
            ),
        ),
    ):
        log.append("s", signal(f"m-{activation_id}"))
        start(log, activation_id, f"m-{activation_id}")
        if isinstance(effect, ToolCallFinished):
            log.append(activation_id, effect)
        elif effect is not None:
            log.append("s", effect)
        log.append(activation_id, ActivationCompleted(text=""))
        assert s.last_ended is not None
        assert s.last_ended.useful is (effect is not None), activation_id


def test_a_read_only_tools_success_is_no_effect_for_the_nudge_rule() -> None:
    """DESIGN §6: no message, no completion, no tool *effect*. A file read that succeeded
    changed nothing; a write beside it did."""
    world, log = opened()
    s = world.sessions["s"]
    digest = "0" * 64
    for activation_id, calls in (
        ("r1", [("c1", True)]),
        ("r2", [("c1", True), ("c2", False)]),
    ):
        log.append("s", signal(f"m-{activation_id}"))
        start(log, activation_id, f"m-{activation_id}")
        for call_id, read_only in calls:
            started = ToolCallStarted(
                call_id=call_id,
                tool="file.read" if read_only else "file.write",
                arguments_digest=digest,
                arguments_size=2,
                read_only=read_only,
            )
            log.append(activation_id, started)
            log.append(activation_id, ToolCallFinished(call_id=call_id, status="ok", duration_ms=1))
        log.append(activation_id, ActivationCompleted(text=""))
        assert s.last_ended is not None
        assert s.last_ended.useful is (activation_id == "r2"), activation_id


def test_admission_goes_round_robin_across_projects_within_limits() -> None:
    admission = Admission()
    for project, sessions in (("a", ["a1", "a2", "a3"]), ("b", ["b1", "b2"]), ("c", ["c1"])):
        for session_id in sessions:
            admission.want(project, session_id)
    started: list[str] = []
    limit = {"a": 2, "b": 5, "c": 5}
    count: defaultdict[str, int] = defaultdict(int)

    def fits(project: str, _: str) -> bool:
        return count[project] < limit[project] and len(started) < 5

    def room(project: str) -> bool:
        return count[project] < limit[project]

    for session_id in admission.admit(fits, room):
        started.append(session_id)
        count[session_id[0]] += 1
    assert started == ["a1", "b1", "c1", "a2", "b2"]
    assert admission.waiting() == 1  # a3: its project is at its limit
    count["a"] = 0
    started.clear()
    assert list(admission.admit(lambda p, s: True, lambda p: True)) == ["a3"]


def test_admission_passes_over_a_project_without_room_without_asking_its_sessions() -> None:
    """Thousands of sessions waiting behind their project's limit (a batch job) cost nothing
    per decision: each was asked whether it fits, after each start anywhere — seconds of the
    event loop per decision."""
    admission = Admission()
    for i in range(5_000):
        admission.want("full", f"f{i}")
    for i in range(50):
        admission.want("other", f"o{i}")
    asked: defaultdict[str, int] = defaultdict(int)

    def fits(project: str, _: str) -> bool:
        asked[project] += 1
        return project == "other"

    started = list(admission.admit(fits, lambda project: project == "other"))
    assert started == [f"o{i}" for i in range(50)]
    assert asked == {"other": 50}
    assert admission.waiting() == 5_000


def test_admission_passes_over_a_full_pool_without_asking_its_sessions() -> None:
    """The same for a pool's limit: a project with room and thousands of its sessions waiting
    on a full pool asked each of them, after each start anywhere — while its sessions on
    another pool still start, in the order the project's sessions asked."""
    admission = Admission()
    admission.want("p", "g0", "gpu")
    for i in range(5_000):
        admission.want("p", f"full{i}", "docker")
    for i in range(1, 4):
        admission.want("p", f"g{i}", "gpu")
    asked: defaultdict[str, int] = defaultdict(int)

    def fits(_: str, session_id: str) -> bool:
        asked[session_id[0]] += 1
        return session_id.startswith("g")

    def pool_room(pool: str) -> bool:
        return pool == "gpu"

    started = list(admission.admit(fits, lambda _: True, pool_room))
    assert started == ["g0", "g1", "g2", "g3"]
    assert asked == {"g": 4}
    assert admission.waiting() == 5_000
    # Room again: the earliest asking goes first whichever pool it waits on.
    admission.want("p", "late", "gpu")
    assert list(admission.admit(lambda p, s: True, lambda p: True))[:2] == ["full0", "full1"]


def test_admission_keeps_a_sessions_turn_when_it_asks_again_or_moves_pool() -> None:
    admission = Admission()
    for session_id in ("s1", "s2", "s3"):
        admission.want("p", session_id, "a")
    admission.want("p", "s4", "b")
    admission.want("p", "s1", "a")  # asked again: still first
    admission.want("p", "s2", "b")  # its agent moved to another pool: still before s3, s4
    assert admission.waiting() == 4
    everything = list(admission.admit(lambda p, s: True, lambda p: True))
    assert everything == ["s1", "s2", "s3", "s4"]
    assert admission.waiting() == 0


def test_admission_refiles_sessions_whose_pool_changed() -> None:
    """An agent's runtime profile (or a profile's pool) changed while its sessions waited
    behind the old pool's limit: they start on the new pool, which has room."""
    admission = Admission()
    for session_id in ("s1", "s2"):
        admission.want("p", session_id, "full")
    admission.want("p", "s3", "free")
    admission.refile(lambda session_id: "full" if session_id == "s1" else "free")
    started = list(admission.admit(lambda p, s: True, lambda p: True, lambda pool: pool == "free"))
    assert started == ["s2", "s3"]
    assert admission.waiting() == 1


def test_timers_wake_at_the_earliest_deadline_per_session() -> None:
    timers = Timers()
    assert timers.add(T0 + timedelta(seconds=10), "s1")
    assert not timers.add(T0 + timedelta(seconds=20), "s1")  # later than the one it has
    assert timers.add(T0 + timedelta(seconds=5), "s2")
    assert timers.next_at() == T0 + timedelta(seconds=5)
    assert timers.pop_due(T0 + timedelta(seconds=6)) == {"s2"}
    assert timers.pop_due(T0 + timedelta(seconds=60)) == {"s1"}
    assert len(timers) == 0


def test_a_far_deadline_pushed_again_after_each_near_one_does_not_pile_up() -> None:
    """A session with a signal due in 30 days and a near deadline again and again (backoffs,
    delayed signals): after each near one fires, the far one is added again. The copies that
    are no session's earliest any more must not stay until their own time."""
    timers = Timers()
    far = T0 + timedelta(days=30)
    timers.add(far, "s")
    for i in range(1, 1_001):
        near = T0 + timedelta(seconds=i)
        assert timers.add(near, "s")
        assert timers.pop_due(near) == {"s"}
        timers.add(far, "s")  # looked at again: its earliest is the far one once more
    assert len(timers._heap) <= 2 * len(timers) + 65
    assert timers.next_at() == far
    assert timers.pop_due(far) == {"s"}
