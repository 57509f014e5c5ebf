"""The pending action aggregate: a question, approval or file request awaiting a person."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import ClassVar

from suzumio.contracts.commands import (
    AnswerPendingAction,
    CreatePendingAction,
    ExpirePendingAction,
)
from suzumio.contracts.envelope import DomainEvent
from suzumio.contracts.errors import ConflictError, ForbiddenError, InvalidError, id_taken
from suzumio.contracts.events import (
    PendingActionAnswered,
    PendingActionCancelled,
    PendingActionCreated,
    PendingActionExpired,
    SignalRecorded,
)
from suzumio.contracts.ids import derived_id
from suzumio.contracts.values import PendingKind, Priority, SignalKind
from suzumio.session.domain.session import SessionState, fenced_because
from suzumio.session.domain.state import AggregateState

OUTCOMES = frozenset({PendingActionAnswered.event_type, PendingActionExpired.event_type})
"""The events that end a pending action and so wake its session's agent."""
CANCELLED_WITH_ITS_ACTIVATION = "its activation was cancelled, and its work with it"


class PendingActionState(AggregateState):
    aggregate: ClassVar[str] = "pending_action"

    def __init__(self, aggregate_id: str) -> None:
        super().__init__(aggregate_id)
        self.project_id = ""
        self.session_id = ""
        self.kind = PendingKind.QUESTION
        self.options: tuple[str, ...] = ()
        self.expires_at = datetime.max.replace(tzinfo=UTC)
        self.activation_id: str | None = None
        self.status = "open"

    def apply(self, data: DomainEvent) -> None:
        match data:
            case PendingActionCreated():
                self.project_id, self.session_id = data.project_id, data.session_id
                self.kind, self.options, self.expires_at = data.kind, data.options, data.expires_at
                self.activation_id = data.activation_id
            case PendingActionAnswered():
                self.status = "answered"
            case PendingActionExpired():
                self.status = "expired"
            case PendingActionCancelled():
                self.status = "cancelled"


def create(
    state: PendingActionState, session: SessionState, cmd: CreatePendingAction, now: datetime
) -> list[DomainEvent]:
    if state.exists:
        raise id_taken("a pending action")
    if session.closed:
        raise ConflictError("the session is closed")
    fenced = fenced_because(session, cmd.activation_id)
    if fenced is not None:
        # The broker checked before it asked; a cancel (or a later activation) stored while
        # the call was on its way must not leave the user a question from one that is gone.
        raise ForbiddenError(fenced)
    if cmd.kind is PendingKind.ARTIFACT_REQUEST and not cmd.paths:
        raise InvalidError("an artifact request names the paths it wants")
    return [
        PendingActionCreated(
            project_id=session.project_id,
            session_id=session.id,
            agent_id=session.agent_id,
            activation_id=cmd.activation_id,
            kind=cmd.kind,
            prompt=cmd.prompt,
            options=cmd.options,
            paths=cmd.paths,
            expires_at=now + timedelta(seconds=cmd.timeout_seconds),
        )
    ]


def _open(state: PendingActionState, now: datetime) -> None:
    if state.status != "open":
        raise ConflictError(f"the pending action is {state.status} already")
    if now >= state.expires_at:
        raise ConflictError("the pending action has expired")


def answer(
    state: PendingActionState, cmd: AnswerPendingAction, by: str, now: datetime
) -> list[DomainEvent]:
    _open(state, now)
    if state.kind is PendingKind.APPROVAL and cmd.approved is None:
        raise InvalidError("an approval needs `approved` true or false")
    if state.kind is PendingKind.ARTIFACT_REQUEST and not cmd.artifact_ids:
        raise InvalidError("an artifact request is answered with artifact ids")
    if state.kind is PendingKind.QUESTION and not (cmd.answer or "").strip():
        raise InvalidError("a question is answered with a non-empty `answer`")
    if state.kind is not PendingKind.APPROVAL and cmd.approved is not None:
        raise InvalidError("`approved` answers an approval only")
    if state.kind is not PendingKind.ARTIFACT_REQUEST and cmd.artifact_ids:
        raise InvalidError("`artifact_ids` answer an artifact request only")
    if state.options and cmd.answer and cmd.answer not in state.options:
        raise InvalidError(f"the answer must be one of {list(state.options)}")
    return [
        PendingActionAnswered(
            answer=cmd.answer, approved=cmd.approved, artifact_ids=cmd.artifact_ids, answered_by=by
        )
    ]


def expire(
    state: PendingActionState, session: SessionState, _: ExpirePendingAction, now: datetime
) -> list[DomainEvent]:
    """Expired, which wakes the agent to say so — unless a person cancelled the activation
    that asked: its work went with it, and the agent must not start again an hour later on
    its own. Such an action is cancelled instead. (An answer a person gives it meanwhile
    still wakes the agent: that is someone asking for the work again.)"""
    if state.status != "open" or now < state.expires_at:
        return []
    if state.activation_id is not None and state.activation_id in session.work_cancelled:
        return [PendingActionCancelled(reason=CANCELLED_WITH_ITS_ACTIVATION)]
    return [PendingActionExpired()]


def cancel_if_fenced(state: PendingActionState, session: SessionState) -> list[DomainEvent]:
    """An action just created for an activation that a cancel (or a later activation) fenced
    in the meantime — the create was checked on the session as it was read, and the cancel
    stored after that: cancelled at once, so no one is left a question from work that is
    gone."""
    if state.status != "open" or state.activation_id is None:
        return []
    why = fenced_because(session, state.activation_id)
    return [] if why is None else [PendingActionCancelled(reason=why)]


def resume_signal_id(pending_action_id: str) -> str:
    """The id of the signal that reports a pending action's outcome: derived, so the handler
    and the catch-up reaction can both try to record it and only one copy exists."""
    return derived_id("pending_action.resume", pending_action_id)


def resume_signal(
    state: PendingActionState, session: SessionState, outcome: DomainEvent
) -> list[DomainEvent]:
    """The signal that wakes the session's agent with the outcome (P1: at its next tool
    boundary if it still runs, else in a new activation). Recorded on a closed session too:
    the scheduler holds it until a reopen. Left out, an action expired (or answered, in a
    race with the close) while the session was closed would never reach its agent, and a
    second answer after the reopen is refused."""
    kinds = {
        PendingKind.APPROVAL: SignalKind.APPROVAL_RESULT,
        PendingKind.ARTIFACT_REQUEST: SignalKind.ARTIFACT_READY,
    }
    signal_id = resume_signal_id(state.id)
    if signal_id in session.signals or state.id in session.resumed:
        return []
    if (
        isinstance(outcome, PendingActionExpired)
        and state.activation_id is not None
        and state.activation_id in session.work_cancelled
    ):
        # `expire` decided on the session as it read it; a cancel stored since took the
        # activation's work with it, and this append is conditional on the session as it is.
        return []
    payload = {"pending_action_id": state.id, **outcome.model_dump(mode="json")}
    payload["outcome"] = outcome.event_type.rsplit(".", 1)[-1]
    return [
        SignalRecorded(
            signal_id=signal_id,
            agent_id=session.agent_id,
            kind=kinds.get(state.kind, SignalKind.USER_MESSAGE),
            priority=Priority.P1,
            payload=payload,
        )
    ]
