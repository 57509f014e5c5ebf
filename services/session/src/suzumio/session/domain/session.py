"""The session aggregate: one conversation timeline of an agent, its messages and signals."""

from __future__ import annotations

from typing import ClassVar

from suzumio.contracts.commands import (
    CloseSession,
    OpenSession,
    PostMessage,
    RecordSignal,
    ReopenSession,
)
from suzumio.contracts.envelope import DomainEvent
from suzumio.contracts.errors import ConflictError, ForbiddenError
from suzumio.contracts.events import (
    SessionClosed,
    SessionMessageAppended,
    SessionOpened,
    SessionReopened,
    SignalRecorded,
)
from suzumio.contracts.values import Author, Priority, SignalKind
from suzumio.session.domain.agent import AgentState
from suzumio.session.domain.state import AggregateState

DEFAULT_USER_MESSAGE_PRIORITY = Priority.P1
DEFAULT_PLATFORM_MESSAGE_PRIORITY = Priority.P3

# Kinds a user may record directly; the others are the platform's to record (a message, an
# approval's result, a file's arrival) and must not be forged.
USER_SIGNAL_KINDS = frozenset({SignalKind.CUSTOM, SignalKind.TIMER})


class SessionState(AggregateState):
    aggregate: ClassVar[str] = "session"

    def __init__(self, aggregate_id: str) -> None:
        super().__init__(aggregate_id)
        self.project_id = ""
        self.agent_id = ""
        self.closed = False
        self.signals: set[str] = set()
        self.resumed: set[str] = set()  # pending actions whose outcome was signalled

    def apply(self, data: DomainEvent) -> None:
        match data:
            case SessionOpened():
                self.project_id, self.agent_id = data.project_id, data.agent_id
            case SessionClosed():
                self.closed = True
            case SessionReopened():
                self.closed = False
            case SignalRecorded():
                self.signals.add(data.signal_id)
                action = data.payload.get("pending_action_id")
                if isinstance(action, str) and data.kind not in USER_SIGNAL_KINDS:
                    self.resumed.add(action)


def open_(state: SessionState, agent: AgentState, cmd: OpenSession) -> list[DomainEvent]:
    if state.exists:
        raise ConflictError("a session with this id exists already")
    if agent.disabled:
        raise ConflictError("the agent is disabled")
    return [SessionOpened(project_id=agent.project_id, agent_id=agent.id, title=cmd.title)]


def _writable(state: SessionState) -> None:
    if state.closed:
        raise ConflictError("the session is closed; reopen it to write to it")


def close(state: SessionState, cmd: CloseSession) -> list[DomainEvent]:
    return [] if state.closed else [SessionClosed(reason=cmd.reason)]


def reopen(state: SessionState, _: ReopenSession) -> list[DomainEvent]:
    return [SessionReopened()] if state.closed else []


def post_message(state: SessionState, cmd: PostMessage, author: Author) -> list[DomainEvent]:
    """A message to the session's agent and the signal that tells it. A user's message is P1
    by default; the platform's (a toolpack's scheduler hook, say) is routine work, P3."""
    _writable(state)
    if cmd.signal_id in state.signals:
        raise ConflictError("a signal with this id exists already")
    by_user = author.kind == "user"
    message = SessionMessageAppended(
        message_id=cmd.message_id,
        author=author,
        role="user",
        text=cmd.text,
    )
    signal = SignalRecorded(
        signal_id=cmd.signal_id,
        agent_id=state.agent_id,
        kind=SignalKind.USER_MESSAGE if by_user else SignalKind.MESSAGE_CREATED,
        priority=cmd.priority
        or (DEFAULT_USER_MESSAGE_PRIORITY if by_user else DEFAULT_PLATFORM_MESSAGE_PRIORITY),
        message_id=cmd.message_id,
    )
    return [message, signal]


def record_signal(state: SessionState, cmd: RecordSignal, *, by_user: bool) -> list[DomainEvent]:
    _writable(state)
    if by_user and cmd.kind not in USER_SIGNAL_KINDS:
        raise ForbiddenError(f"{cmd.kind.value} signals are recorded by the platform")
    if cmd.signal_id in state.signals:
        raise ConflictError("a signal with this id exists already")
    return [
        SignalRecorded(
            signal_id=cmd.signal_id,
            agent_id=state.agent_id,
            kind=cmd.kind,
            priority=cmd.priority,
            payload=cmd.payload,
            not_before=cmd.not_before,
        )
    ]
