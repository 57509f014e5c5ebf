"""Events of the `activation` aggregate: one execution of an agent, from launch to its end.

An activation begins as `session.activation_requested` on its session; the orchestrator then
writes its lifecycle here. Exactly one terminal event (completed, failed, cancelled, timed_out)
ends it, with the sandbox's exit code where it had one (None: it never started, or it vanished
without a code — a lost worker, a deleted pod).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from suzumio.contracts.envelope import DomainEvent, event
from suzumio.contracts.ids import Identifier


@event("activation.started")
class ActivationStarted(DomainEvent):
    session_id: Identifier
    project_id: Identifier
    agent_id: Identifier
    backend: str
    sandbox_id: str = ""


@event("activation.completed")
class ActivationCompleted(DomainEvent):
    text: str
    usage: dict[str, Any] = Field(default_factory=dict)
    reason: str = "completed"
    exit_code: int | None = None


@event("activation.failed")
class ActivationFailed(DomainEvent):
    reason: str
    exit_code: int | None = None
    retryable: bool = True


@event("activation.cancelled")
class ActivationCancelled(DomainEvent):
    reason: str = ""
    exit_code: int | None = None


@event("activation.timed_out")
class ActivationTimedOut(DomainEvent):
    timeout_seconds: float
    exit_code: int | None = None


@event("activation.output_recorded")
class ActivationOutputRecorded(DomainEvent):
    """The runner's final output, accepted by the tool-broker: the only way a result exists.
    The orchestrator turns the sandbox's exit into the terminal event."""

    text: str = Field(max_length=1_000_000)
    usage: dict[str, Any] = Field(default_factory=dict)
    reason: Literal["completed", "budget_exhausted", "waiting", "failed"] = "completed"


TERMINAL_ACTIVATION_EVENTS: frozenset[str] = frozenset(
    {"activation.completed", "activation.failed", "activation.cancelled", "activation.timed_out"}
)


@event("activation.tool_call_started")
class ToolCallStarted(DomainEvent):
    """Audit record of a tool call (written by the tool-broker)."""

    call_id: str = Field(max_length=200)
    tool: str = Field(max_length=200)
    arguments_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    arguments_size: int = Field(ge=0)
    read_only: bool = Field(
        default=False, description="a tool that changes nothing: its success is no effect"
    )


@event("activation.tool_call_finished")
class ToolCallFinished(DomainEvent):
    call_id: str = Field(max_length=200)
    status: Literal["ok", "error", "denied", "timeout", "cancelled"]
    result_digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    result_size: int = Field(default=0, ge=0)
    duration_ms: int = Field(ge=0)
    error: str = Field(default="", max_length=2_000)
