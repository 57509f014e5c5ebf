"""What a toolpack's scheduler hook sees and may ask for (DESIGN.md §6, §7 toolpacks).

A hook is an async (or plain) callable `hook(state: AgentSchedulingState) -> Sequence[HookAction]`
named by an installed toolpack's manifest (`scheduler_hooks`: called for the agents that enable
that toolpack only), or registered under the entry point group `suzumio.scheduler_hooks` (or the
scheduler's `SUZUMIO_HOOKS` setting: called for every agent). The scheduler calls it when an
activation of the agent's session has ended, before its own nudge rule; the actions become
messages or signals on that session. A hook that raises or overruns its time is logged and
skipped.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import CleanJson, Priority, SignalKind, Text

HOOKS_ENTRY_POINT_GROUP = "suzumio.scheduler_hooks"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PendingSignalView(_Frozen):
    id: Identifier
    kind: SignalKind
    priority: Priority
    not_before: datetime | None = None


class EndedActivationView(_Frozen):
    id: Identifier
    outcome: Literal["completed", "failed", "cancelled", "timed_out"]
    useful_effect: bool = Field(description="it wrote a message, a tool call succeeded, or output")
    signal_ids: tuple[Identifier, ...]


class AgentSchedulingState(_Frozen):
    """One agent's session as the scheduler sees it."""

    project_id: Identifier
    agent_id: Identifier
    session_id: Identifier
    live_activation_id: Identifier | None = Field(description="the activation running now, if any")
    pending: tuple[PendingSignalView, ...]
    last_activation: EndedActivationView | None = None
    toolpacks: tuple[str, ...] = Field(default=(), description="the toolpacks the agent enables")


class HookSignal(_Frozen):
    """Record a signal (pending work) on the session."""

    type: Literal["signal"] = "signal"
    key: str = Field(
        min_length=1,
        max_length=200,
        description="names this action among the hook's actions for one ended activation; "
        "the same key is recorded once however often the hook is called",
    )
    kind: SignalKind = SignalKind.CUSTOM
    priority: Priority = Priority.P3
    payload: CleanJson = Field(default_factory=dict)
    not_before: datetime | None = None


class HookMessage(_Frozen):
    """Post a message to the session's agent (with its `message.created` signal)."""

    type: Literal["message"] = "message"
    key: str = Field(min_length=1, max_length=200)
    text: Text = Field(min_length=1)
    priority: Priority | None = Field(default=None, description="P3 unless set")


HookAction = Annotated[HookSignal | HookMessage, Field(discriminator="type")]
SchedulerHook = Callable[
    [AgentSchedulingState], Awaitable[Sequence[HookAction]] | Sequence[HookAction]
]
