"""Events of the `session` aggregate: one conversation timeline of an agent.

Signals and the scheduler's decisions live on the session's subject too: appends there are
conditional, which is what serialises the session service and the scheduler replicas and keeps
"one live activation per session" true across hosts (DESIGN.md §4, §6).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from suzumio.contracts.envelope import DomainEvent, JsonObject, event, upcaster
from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import (
    ActivationReason,
    Author,
    Priority,
    SignalKind,
    SignalOutcome,
    Text,
)


@event("session.opened")
class SessionOpened(DomainEvent):
    project_id: Identifier
    agent_id: Identifier
    title: str = Field(default="", max_length=500)


class HistoryToolCall(BaseModel):
    """A tool call as the model made it, kept in history so the next model call sees it."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(max_length=200)
    name: str = Field(max_length=200)
    arguments: str = Field(max_length=1_000_000, description="JSON text as the model wrote it")


@event("session.message_appended", schema=2)
class SessionMessageAppended(DomainEvent):
    """A visible entry of the session's history (DESIGN.md §7: append-only agent history)."""

    message_id: Identifier
    author: Author
    role: str = Field(description="model-facing role: user, assistant, tool or system")
    text: Text
    activation_id: Identifier | None = Field(
        default=None, description="the activation that wrote it (agent entries)"
    )
    tool_calls: tuple[HistoryToolCall, ...] = Field(
        default=(), max_length=128, description="an assistant entry's tool calls"
    )
    tool_call_id: str | None = Field(
        default=None, max_length=200, description="a tool entry: the call it answers"
    )
    name: str | None = Field(default=None, max_length=200, description="a tool entry's tool")


@upcaster("session.message_appended", from_schema=1)
def _message_appended_v1_v2(data: JsonObject) -> JsonObject:
    # v1 named the writer with one string ("user:<id>", "agent:<id>") and had no role.
    kind, _, ident = str(data.get("author", "system:")).partition(":")
    role = {"user": "user", "agent": "assistant"}.get(kind, "system")
    lifted: dict[str, Any] = {k: v for k, v in data.items() if k != "author"}
    lifted["author"] = {"kind": kind if kind in {"user", "agent"} else "system", "id": ident}
    lifted.setdefault("role", role)
    return lifted


@event("session.closed")
class SessionClosed(DomainEvent):
    reason: str = Field(default="", max_length=2_000)


@event("session.reopened")
class SessionReopened(DomainEvent):
    pass


@event("session.signal_recorded")
class SignalRecorded(DomainEvent):
    signal_id: Identifier
    agent_id: Identifier
    kind: SignalKind
    priority: Priority
    payload: JsonObject = Field(default_factory=dict)
    message_id: Identifier | None = None
    not_before: datetime | None = Field(
        default=None, description="delayed work: not deliverable before this instant"
    )


@event("session.signals_delivered")
class SignalsDelivered(DomainEvent):
    activation_id: Identifier
    signal_ids: tuple[Identifier, ...]


@event("session.signal_closed")
class SignalClosed(DomainEvent):
    signal_id: Identifier
    outcome: SignalOutcome
    reason: str = ""


@event("session.activation_requested")
class ActivationRequested(DomainEvent):
    """The scheduler's decision to start an activation with this ordered batch of signals."""

    activation_id: Identifier
    agent_id: Identifier
    signal_ids: tuple[Identifier, ...]
    reason: ActivationReason = ActivationReason.SIGNALS
    attempt: int = Field(default=1, ge=1)
    pool: str | None = Field(default=None, description="the capacity pool it counts against")
    project_id: Identifier | None = None
    replaces: Identifier | None = Field(
        default=None, description="the activation a P0 cancelled to make way for this one"
    )


@event("session.activation_cancel_requested")
class ActivationCancelRequested(DomainEvent):
    activation_id: Identifier
    reason: str = ""
    closes_work: bool = Field(
        default=False,
        description="a person's cancel: the activation's work goes with it (its signals are "
        "closed, and its open pending actions are cancelled instead of waking the agent when "
        "they expire); a P0's replacement leaves them for the activation that replaces it",
    )


@event("session.history_compacted")
class HistoryCompacted(DomainEvent):
    """A compaction marker: the entries `archived_from`..`archived_through` (message ids, in
    log order) are summarised by `summary` in the active history. The raw entries stay in the
    log (archived, not deleted)."""

    activation_id: Identifier
    marker_id: Identifier
    summary: Text
    archived_from: Identifier
    archived_through: Identifier
    archived_count: int = Field(ge=1)
    archived_ids: tuple[Identifier, ...] = Field(
        default=(), max_length=10_000, description="exactly the entries the summary replaces"
    )
    tokens_before: int = Field(default=0, ge=0)
    tokens_after: int = Field(default=0, ge=0)


@event("session.checkpoint_saved")
class CheckpointSaved(DomainEvent):
    """A runner's snapshot for the session, used to resume (the latest one counts)."""

    checkpoint_id: Identifier
    activation_id: Identifier
    data: JsonObject
