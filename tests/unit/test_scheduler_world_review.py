"""Fixes from a review of the scheduler, at the level of its fold and rules: a P0 queued again
after its activation was replaced does not preempt the replacement; enabling an agent looks
again at its sessions; a hung plain-function hook cannot starve the loop's default executor."""

from __future__ import annotations

import asyncio
import threading
import time

from suzumio.contracts.events import (
    ActivationCancelled,
    ActivationCancelRequested,
    ActivationCompleted,
    ActivationFailed,
    ActivationRequested,
    AgentCreated,
    AgentDisabled,
    AgentEnabled,
    SessionOpened,
    SignalClosed,
    SignalsDelivered,
)
from suzumio.contracts.scheduling import AgentSchedulingState, HookAction, HookSignal
from suzumio.contracts.values import ActivationReason, ModelSpec, Priority, SignalOutcome
from suzumio.scheduler.domain import policy
from suzumio.scheduler.domain.world import World
from suzumio.scheduler.hooks import THREADS_PER_HOOK, Hooks, NamedHook
from tests.unit.test_scheduling_state import T0, Log, opened, signal, start

SETTINGS = policy.Settings()


def decide(world: World) -> policy.Plan:
    return policy.decide(world.sessions["s"], T0, startable=True, settings=SETTINGS)


def preempt(log: Log, plan: policy.Plan, activation_id: str) -> None:
    """Append what the engine appends for a preempting plan."""
    assert plan.cancel is not None
    assert plan.start is not None
    log.append(
        "s",
        ActivationCancelRequested(activation_id=plan.cancel, reason="replaced: a P0"),
        ActivationRequested(
            activation_id=activation_id,
            agent_id="a",
            signal_ids=plan.start.signal_ids,
            project_id="p",
            replaces=plan.cancel,
        ),
        SignalsDelivered(activation_id=activation_id, signal_ids=plan.start.signal_ids),
    )


def test_a_p0_queued_again_after_a_preemption_does_not_preempt_the_replacement() -> None:
    """Two P0s in a row: the second replaces the first's activation, which ends cancelled and
    queues the first P0 again. That one must wait for the replacement's end (and then start,
    first), not preempt it: else each preempts the other's activation forever."""
    world, log = opened()
    log.append("s", signal("stop1", Priority.P0))
    start(log, "a1", "stop1")
    log.append("s", signal("stop2", Priority.P0))
    plan = decide(world)
    assert plan.cancel == "a1"
    assert plan.start is not None
    assert plan.start.signal_ids == ("stop2",)
    preempt(log, plan, "a2")
    log.append("a1", ActivationCancelled(reason="replaced"))
    assert "stop1" in world.sessions["s"].pending  # queued again: not lost

    again = decide(world)
    assert (again.cancel, again.start) == (None, None)  # a2 runs on

    log.append("a2", ActivationCompleted(text="done"))
    after = decide(world)
    assert after.cancel is None
    assert after.start is not None
    assert after.start.signal_ids == ("stop1",)
    assert after.start.reason is ActivationReason.SIGNALS


def requeued_then_fresh_p0() -> World:
    """a2 replaced a1 (P0 stop2); a1 ended cancelled, stop1 queued again; then P0 stop3."""
    world, log = opened()
    log.append("s", signal("stop1", Priority.P0))
    start(log, "a1", "stop1")
    log.append("s", signal("stop2", Priority.P0))
    preempt(log, decide(world), "a2")
    log.append("a1", ActivationCancelled(reason="replaced"))
    log.append("s", signal("stop3", Priority.P0))
    return world


def test_a_fresh_p0_still_preempts_and_takes_a_requeued_one_along() -> None:
    world = requeued_then_fresh_p0()
    plan = decide(world)
    assert plan.cancel == "a2"
    assert plan.start is not None
    assert set(plan.start.signal_ids) == {"stop1", "stop3"}
    assert plan.start.reason is ActivationReason.PREEMPT


def test_the_p0_that_preempts_goes_first_into_a_batch_of_one() -> None:
    """Requeued P0s are older: taken first into a batch of one, they would leave the fresh P0
    out, and the next decision would preempt the activation that just started."""
    world = requeued_then_fresh_p0()
    one = policy.Settings(max_batch=1)
    plan = policy.decide(world.sessions["s"], T0, startable=True, settings=one)
    assert plan.cancel == "a2"
    assert plan.start is not None
    assert plan.start.signal_ids == ("stop3",)


def test_p0_after_p0_waits_for_the_replaced_activation_to_end_before_replacing_again() -> None:
    """A replacement takes no admission: its replaced activation still holds capacity until
    it ends. A fresh P0 while it winds down would replace again, one more over the project's
    limit per message, without bound; it waits for that end instead, then preempts."""
    world, log = opened()
    log.append("s", signal("m", Priority.P2))
    start(log, "a1", "m")
    log.append("s", signal("stop1", Priority.P0))
    preempt(log, decide(world), "a2")  # a1 is cancel-requested, still running
    log.append("s", signal("stop2", Priority.P0))
    held = decide(world)
    assert (held.cancel, held.start) == (None, None)
    assert world.running_by_project["p"] == 2  # a1 winding down, a2 live: one over, no more

    changes = log.append("a1", ActivationCancelled(reason="replaced"))
    assert "s" in changes.sessions  # looked at again
    plan = decide(world)
    assert plan.cancel == "a2"
    assert plan.start is not None
    assert "stop2" in plan.start.signal_ids


def test_a_p0_replaces_the_live_activation_while_one_a_user_cancelled_winds_down() -> None:
    """Only the activation a P0 replaced holds the next P0 back: one the user cancelled was
    counted when the live one was admitted, so replacing the live one stays one over the
    limits at most — a P0 waited for it (a docker stop, a pod's grace, the wall clock)."""
    world, log = opened()
    log.append("s", signal("m1", Priority.P2))
    start(log, "a1", "m1")
    log.append(
        "s",
        ActivationCancelRequested(activation_id="a1", reason="asked"),
        SignalClosed(signal_id="m1", outcome=SignalOutcome.CANCELLED),
    )
    log.append("s", signal("m2", Priority.P2))
    start(log, "a2", "m2")  # admitted with a1 counted, still winding down
    log.append("s", signal("stop", Priority.P0))
    plan = decide(world)
    assert plan.cancel == "a2"
    assert plan.start is not None
    assert plan.start.signal_ids[0] == "stop"
    preempt(log, plan, "a3")
    assert world.running_by_project["p"] == 3  # a1, a2 winding down, a3 live: one over
    log.append("s", signal("stop2", Priority.P0))
    held = decide(world)  # a2, which a3 replaced, still winds down
    assert (held.cancel, held.start) == (None, None)
    log.append("a1", ActivationCancelled(reason="asked"))
    assert (decide(world).cancel, decide(world).start) == (None, None)
    log.append("a2", ActivationCancelled(reason="replaced"))
    assert decide(world).cancel == "a3"


def test_enabling_an_agent_looks_again_at_its_sessions_with_pending_signals() -> None:
    world, log = opened()
    log.append(
        "b",
        AgentCreated(project_id="p", name="other", role="r", prompt="", model=ModelSpec(name="m")),
    )
    log.append("t", SessionOpened(project_id="p", agent_id="b"))  # the other agent's
    log.append("idle", SessionOpened(project_id="p", agent_id="a"))  # nothing pending
    log.append("t", signal("other"))
    log.append("a", AgentDisabled())
    log.append("s", signal("m1"))
    assert not world.startable(world.sessions["s"])

    changes = log.append("a", AgentEnabled())
    assert changes.sessions == {"s"}
    plan = decide(world)
    assert plan.start is not None
    assert plan.start.signal_ids == ("m1",)


async def test_a_hung_plain_hook_holds_few_threads_and_never_starves_the_default_executor() -> None:
    """A plain-function hook that hangs overruns its timeout and goes on in its thread. Its
    hung calls hold at most `THREADS_PER_HOOK` threads (the next calls time out waiting), all
    outside the loop's default executor, which the loop's getaddrinfo (NATS reconnects,
    Postgres connections) needs."""
    release = threading.Event()
    calls: list[str] = []

    def stuck(state: AgentSchedulingState) -> list[HookAction]:
        calls.append(state.session_id)
        release.wait(60)  # an HTTP call without a timeout, say
        return []

    hooks = Hooks([NamedHook("stuck", stuck)], timeout=0.05)
    loop = asyncio.get_running_loop()
    try:
        for _ in range(40):  # more activations ended than any default executor has threads
            assert await hooks.run(hook_state("s")) == []
        assert len(calls) == THREADS_PER_HOOK
        answer = await asyncio.wait_for(loop.run_in_executor(None, lambda: "free"), 20)
        assert answer == "free"
    finally:
        release.set()
    for _ in range(2_000):  # once the hung calls returned, the hook is called again
        await hooks.run(hook_state("s"))
        if len(calls) > THREADS_PER_HOOK:
            break
        await asyncio.sleep(0.01)
    assert len(calls) > THREADS_PER_HOOK


async def test_a_burst_of_reviews_queued_for_a_slow_hooks_threads_are_all_answered() -> None:
    """Reviews of several sessions run at once (a leader that takes over reviews every recent
    end at once): a plain hook taking a moment (a query) serves them a few at a time, none
    skipped. Each call's time counts from when it has a thread — counted
    while queued, most timed out unasked, and their sessions were nudged as if no hook had
    acted."""

    def slow(state: AgentSchedulingState) -> list[HookAction]:
        time.sleep(0.05)
        return [HookSignal(key=state.session_id)]

    hooks = Hooks([NamedHook("slow", slow)], timeout=0.5)
    answers = await asyncio.gather(*(hooks.run(hook_state(f"s{i}")) for i in range(80)))
    assert [len(a) for a in answers] == [1] * 80


def hook_state(session_id: str) -> AgentSchedulingState:
    return AgentSchedulingState(
        project_id="p", agent_id="a", session_id=session_id, live_activation_id=None, pending=()
    )


def test_a_failed_activation_handed_many_signals_closes_them_a_bounded_batch_at_a_time() -> None:
    """One append holds at most 1,000 events, and an activation may be handed any number of
    P1s: closing them all in one decision was refused as invalid, retried, refused again —
    for good, and the session never started again. They close a batch per decision."""
    world, log = opened(budget=1)
    ids = [f"m{i}" for i in range(450)]
    for signal_id in ids:
        log.append("s", signal(signal_id))
    start(log, "a1", *ids)
    log.append("a1", ActivationFailed(reason="broken", retryable=False))
    closed: list[str] = []
    while True:
        plan = decide(world)
        if not plan.close_failed:
            break
        assert len(plan.close_failed) <= policy.MAX_CLOSES_PER_DECISION
        log.append(
            "s",
            *(
                SignalClosed(signal_id=signal_id, outcome=SignalOutcome.FAILED, reason=why)
                for signal_id, why in plan.close_failed
            ),
        )
        closed += [signal_id for signal_id, _ in plan.close_failed]
    assert sorted(closed) == sorted(ids)
