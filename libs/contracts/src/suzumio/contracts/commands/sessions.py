"""Commands about sessions, their messages and signals."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from suzumio.contracts.commands.base import Command, command
from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import Clean, CleanJson, Priority, SignalKind, Text


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


@command("session", "record_signal")
class RecordSignal(Command):
    """Pending work for the session's agent that is not a message (custom, timers...)."""

    session_id: Identifier
    signal_id: Identifier
    kind: SignalKind = SignalKind.CUSTOM
    priority: Priority = Priority.P3
    payload: CleanJson = Field(default_factory=dict)
    not_before: datetime | None = None
