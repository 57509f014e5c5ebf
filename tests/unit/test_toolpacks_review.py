"""Scheduler hooks are bounded whatever they do: a plain hook's generator runs where the hook
runs (its thread, under its timeout), not on the scheduler's loop; an async hook that takes its
time after being cancelled does not hold the review past the timeout; an answer with more
actions than a hook may ask for is skipped whole."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from typing import cast

from suzumio.contracts.ids import new_id
from suzumio.contracts.scheduling import (
    AgentSchedulingState,
    HookAction,
    HookSignal,
    SchedulerHook,
)
from suzumio.scheduler.hooks import MAX_ACTIONS, THREADS_PER_HOOK, Hooks, NamedHook


def state() -> AgentSchedulingState:
    return AgentSchedulingState(
        project_id=new_id(),
        agent_id=new_id(),
        session_id=new_id(),
        live_activation_id=None,
        pending=(),
    )


# A generator is no `Sequence`, but hooks come from entry points nobody type-checks.


def signal(key: str) -> HookSignal:
    return HookSignal(key=key)


async def test_a_plain_hooks_generator_runs_in_its_thread_under_the_timeout() -> None:
    loop_thread = threading.get_ident()
    ran_on: list[int] = []
    release = threading.Event()
    finished = threading.Event()

    def slow_generator(_: AgentSchedulingState) -> Iterator[HookAction]:
        ran_on.append(threading.get_ident())
        release.wait(5)  # a blocking query, inside the generator's body
        finished.set()
        yield signal("late")

    hooks = Hooks(
        [
            NamedHook("gen", cast("SchedulerHook", slow_generator)),
            NamedHook("ok", lambda _: [signal("a")]),
        ],
        timeout=0.3,
    )
    try:
        actions = await hooks.run(state())
        # The review ended while the generator's body still blocks: it did not wait for it.
        assert not finished.is_set()
    finally:
        release.set()  # let the hook's thread end
    assert [name for name, _ in actions] == ["ok"]  # the slow one timed out, the other counts
    assert ran_on
    assert ran_on[0] != loop_thread  # never on the scheduler's loop


async def test_an_async_hook_slow_to_stop_does_not_hold_the_review() -> None:
    cleaned = asyncio.Event()

    async def stubborn(_: AgentSchedulingState) -> Sequence[HookAction]:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(1.5)  # a clean-up that takes its time (or never ends)
            cleaned.set()
            raise
        return []

    async def fine(_: AgentSchedulingState) -> Sequence[HookAction]:
        return [signal("b")]

    hooks = Hooks([NamedHook("stubborn", stubborn), NamedHook("fine", fine)], timeout=0.3)
    actions = await hooks.run(state())
    assert not cleaned.is_set()  # the review did not wait for the cancelled call's clean-up
    assert [name for name, _ in actions] == ["fine"]
    await asyncio.wait_for(cleaned.wait(), 10)  # let the stubborn one end before the loop closes


async def test_calls_that_ignore_the_cancel_are_bounded_per_hook() -> None:
    release = asyncio.Event()
    calls = 0

    async def deaf(_: AgentSchedulingState) -> Sequence[HookAction]:
        nonlocal calls
        calls += 1
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue  # swallows every cancel until released
        return []

    hooks = Hooks([NamedHook("deaf", deaf)], timeout=0.05)
    for _ in range(THREADS_PER_HOOK + 3):
        assert await asyncio.wait_for(hooks.run(state()), 2) == []
    assert calls == THREADS_PER_HOOK  # the later calls were not started at all
    release.set()
    await asyncio.sleep(0.05)
    assert await hooks.run(state()) == []
    assert calls == THREADS_PER_HOOK + 1  # called again once they ended


async def test_too_many_actions_are_skipped_whole() -> None:
    async def flood(_: AgentSchedulingState) -> Sequence[HookAction]:
        return [signal(f"k{i}") for i in range(MAX_ACTIONS + 1)]

    def endless(_: AgentSchedulingState) -> Iterator[HookAction]:
        i = 0
        while True:
            i += 1
            yield signal(f"e{i}")

    async def most(_: AgentSchedulingState) -> Sequence[HookAction]:
        return [signal(f"m{i}") for i in range(MAX_ACTIONS)]

    hooks = Hooks(
        [
            NamedHook("flood", flood),
            NamedHook("endless", cast("SchedulerHook", endless)),
            NamedHook("most", most),
        ],
        timeout=2,
    )
    actions = await asyncio.wait_for(hooks.run(state()), 5)
    assert {name for name, _ in actions} == {"most"}
    assert len(actions) == MAX_ACTIONS


async def test_a_hook_that_raises_cancelled_fails_alone() -> None:
    async def confused(_: AgentSchedulingState) -> Sequence[HookAction]:
        raise asyncio.CancelledError  # e.g. an inner wait it cancelled, let out

    async def fine(_: AgentSchedulingState) -> Sequence[HookAction]:
        return [signal("c")]

    hooks = Hooks([NamedHook("confused", confused), NamedHook("fine", fine)], timeout=1)
    actions = await hooks.run(state())
    assert [name for name, _ in actions] == ["fine"]
