"""Scheduler hooks used by the tests, loaded as `tests.integration.scheduler_hooks:<name>`."""

from __future__ import annotations

import time

from suzumio.contracts.scheduling import AgentSchedulingState, HookAction, HookSignal

SEEN: list[AgentSchedulingState] = []


async def follow_up(state: AgentSchedulingState) -> list[HookAction]:
    """Asks for one follow-up task after the first activation it sees end, never again."""
    SEEN.append(state)
    if len(SEEN) > 1:
        return []
    return [HookSignal(key="follow-up", payload={"after": state.session_id})]


def broken(_: AgentSchedulingState) -> list[HookAction]:
    raise RuntimeError("this hook is broken")


def slow(_: AgentSchedulingState) -> list[HookAction]:
    time.sleep(3)  # past the hook timeout of the test
    return []


def nonsense(_: AgentSchedulingState) -> list[object]:
    return [{"type": "launch-missiles"}]
