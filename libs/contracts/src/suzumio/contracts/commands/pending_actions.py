"""Commands about pending actions (questions, approvals, artifact requests)."""

from __future__ import annotations

from pydantic import Field

from suzumio.contracts.commands.base import Command, command
from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import Clean, PendingKind


@command("session", "create_pending_action")
class CreatePendingAction(Command):
    """Sent by the tool-broker when a runner asks; the session's agent gets the answer as a
    signal."""

    pending_action_id: Identifier
    session_id: Identifier
    activation_id: Identifier | None = None
    kind: PendingKind
    prompt: Clean = Field(min_length=1, max_length=20_000)
    options: tuple[Clean, ...] = Field(default=(), max_length=50)
    paths: tuple[Clean, ...] = Field(default=(), max_length=100)
    timeout_seconds: int = Field(default=3_600, ge=1, le=30 * 86_400)


@command("session", "answer_pending_action")
class AnswerPendingAction(Command):
    """The wake-up signal's id is derived from the pending action's, so it is recorded once
    however often the answer is retried."""

    pending_action_id: Identifier
    answer: Clean = Field(default="", max_length=100_000)
    approved: bool | None = None
    artifact_ids: tuple[Identifier, ...] = Field(default=(), max_length=100)


@command("session", "expire_pending_action")
class ExpirePendingAction(Command):
    pending_action_id: Identifier
