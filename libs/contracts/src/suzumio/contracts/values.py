"""Small value types shared by events, commands and the runner contract."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
Text = Annotated[str, StringConstraints(max_length=1_000_000)]


class Priority(StrEnum):
    """When a signal becomes visible to the agent (DESIGN.md §6)."""

    P0 = "P0"  # cancel the live activation and restart with this signal first
    P1 = "P1"  # inject at the live activation's next tool boundary, else start one
    P2 = "P2"  # next activation start, ahead of routine work
    P3 = "P3"  # routine queued work


class SignalKind(StrEnum):
    USER_MESSAGE = "user.message"
    MESSAGE_CREATED = "message.created"
    APPROVAL_RESULT = "approval.result"
    ARTIFACT_READY = "artifact.ready"
    TIMER = "timer"
    NUDGE = "nudge"
    CUSTOM = "custom"


class Author(BaseModel):
    """Who wrote a message."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["user", "agent", "system"]
    id: str


class ModelSpec(BaseModel):
    """Which model an agent calls, through which OpenAI-compatible provider settings."""

    model_config = ConfigDict(frozen=True)

    name: Name = Field(description="model name as the provider knows it")
    provider: Name | None = Field(
        default=None, description="provider settings id; none means the platform default"
    )


class ProjectLimits(BaseModel):
    """Concurrency limits the scheduler enforces for a project."""

    model_config = ConfigDict(frozen=True)

    max_concurrent_activations: int = Field(default=8, ge=1, le=10_000)


class SignalOutcome(StrEnum):
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class ActivationReason(StrEnum):
    """Why the scheduler started an activation."""

    SIGNALS = "signals"
    PREEMPT = "preempt"  # a P0 signal cancelled the live one
    RETRY = "retry"
    NUDGE = "nudge"
