"""Scheduler side of the todo toolpack: `remind_when_idle`.

The manifest names it, so the scheduler calls it for the agents that enable `todo` only
(README.md).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from suzumio.contracts.scheduling import AgentSchedulingState, HookAction, HookSignal
from suzumio.contracts.values import Priority, SignalKind
from suzumio_todo.manifest import REMINDER_KIND

REMIND_AFTER = timedelta(minutes=30)


async def remind_when_idle(state: AgentSchedulingState) -> list[HookAction]:
    """After an activation that completed with a useful effect, when the agent has nothing
    else to do, one routine reminder to look at its todo list, due `REMIND_AFTER` later.

    The key names the ended activation, so however often the scheduler asks about it, one
    reminder is recorded; a pending signal (the reminder itself, or anything else) keeps the
    hook quiet, so a session has at most one reminder waiting.
    """
    ended = state.last_activation
    if ended is None or ended.outcome != "completed" or not ended.useful_effect:
        return []
    if state.pending or state.live_activation_id is not None:
        return []
    return [
        HookSignal(
            key=f"{REMINDER_KIND}:{ended.id}",
            kind=SignalKind.CUSTOM,
            priority=Priority.P3,
            payload={
                "kind": REMINDER_KIND,
                "text": "Look at your todo list.",
                "after_activation": ended.id,
            },
            not_before=datetime.now(UTC) + REMIND_AFTER,
        )
    ]
