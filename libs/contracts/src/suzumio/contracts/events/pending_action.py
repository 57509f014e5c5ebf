"""Events of the `pending_action` aggregate: something an activation waits on (DESIGN.md §1)."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from suzumio.contracts.envelope import DomainEvent, event
from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import PendingKind


@event("pending_action.created")
class PendingActionCreated(DomainEvent):
    project_id: Identifier
    session_id: Identifier
    agent_id: Identifier
    activation_id: Identifier | None = None
    kind: PendingKind
    prompt: str = Field(max_length=20_000)
    options: tuple[str, ...] = Field(default=(), max_length=50)
    paths: tuple[str, ...] = Field(default=(), max_length=100, description="requested files")
    expires_at: datetime


@event("pending_action.answered")
class PendingActionAnswered(DomainEvent):
    answer: str = Field(default="", max_length=100_000)
    approved: bool | None = None
    artifact_ids: tuple[Identifier, ...] = ()
    answered_by: str


@event("pending_action.expired")
class PendingActionExpired(DomainEvent):
    pass


@event("pending_action.cancelled")
class PendingActionCancelled(DomainEvent):
    reason: str = ""
