"""Commands about sessions, their messages and signals."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from suzumio.contracts.commands.base import Command, command
from suzumio.contracts.events.session import HistoryToolCall
from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import (
    Clean,
    CleanJson,
    Instant,
    Payload,
    Priority,
    SignalKind,
    Text,
)


@command("session", "open_session")
class OpenSession(Command):
    session_id: Identifier
    agent_id: Identifier
    title: Clean = Field(default="", max_length=500)


@command("session", "close_session")
class CloseSession(Command):
    session_id: Identifier
    reason: Clean = Field(default="", max_length=2_000)


@command("session", "reopen_session")
class ReopenSession(Command):
    session_id: Identifier


@command("session", "post_message")
class PostMessage(Command):
    """A user's message to the session's agent; records a signal for it (DESIGN.md §6)."""

    session_id: Identifier
    message_id: Identifier
    signal_id: Identifier
    text: Text = Field(min_length=1)
    priority: Priority | None = Field(default=None, description="P1 unless set")
    activation_id: Identifier | None = Field(
        default=None,
        description="an activation of this session posting it (through the tool-broker): "
        "refused once that activation may no longer write to its session",
        # Left out when unset: a session service of the release before it refuses a field
        # it does not know (mid-upgrade), and every message would be refused with it.
        exclude_if=lambda v: v is None,
    )


@command("session", "record_signal")
class RecordSignal(Command):
    """Pending work for the session's agent that is not a message (custom, timers...)."""

    session_id: Identifier
    signal_id: Identifier
    kind: SignalKind = SignalKind.CUSTOM
    priority: Priority = Priority.P3
    payload: Payload = Field(default_factory=dict)
    not_before: Instant | None = None
    activation_id: Identifier | None = Field(
        default=None,
        description="the activation recording it (through the tool-broker): refused once that "
        "activation may no longer write to its session (cancelled, or a later one requested)",
        exclude_if=lambda v: v is None,  # as PostMessage's: an older session service
    )


class HistoryEntry(BaseModel):
    """One entry an activation adds to its session's history (through the tool-broker)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    message_id: Identifier
    role: Literal["assistant", "tool", "user"]
    text: Text = ""
    tool_calls: tuple[HistoryToolCall, ...] = Field(default=(), max_length=128)
    tool_call_id: str | None = Field(default=None, max_length=200)
    name: str | None = Field(default=None, max_length=200)


@command("session", "append_history")
class AppendHistory(Command):
    """Visible assistant output, tool records and injected signals of a live activation, in
    the order the model saw them. Entries already recorded (same message id) are skipped, so
    a retried call is harmless."""

    session_id: Identifier
    activation_id: Identifier
    agent_id: Identifier
    entries: tuple[HistoryEntry, ...] = Field(min_length=1, max_length=256)


@command("session", "compact_history")
class CompactHistory(Command):
    session_id: Identifier
    activation_id: Identifier
    marker_id: Identifier
    summary: Text = Field(min_length=1)
    archived_from: Identifier
    archived_through: Identifier
    archived_ids: tuple[Identifier, ...] = Field(default=(), max_length=10_000)
    tokens_before: int = Field(default=0, ge=0)
    tokens_after: int = Field(default=0, ge=0)


@command("session", "save_checkpoint")
class SaveCheckpoint(Command):
    session_id: Identifier
    activation_id: Identifier
    checkpoint_id: Identifier
    data: CleanJson
