"""The session aggregate: one conversation timeline of an agent, its messages and signals."""

from __future__ import annotations

from typing import ClassVar

from suzumio.contracts.commands import (
    AppendHistory,
    CloseSession,
    CompactHistory,
    OpenSession,
    PostMessage,
    RecordSignal,
    ReopenSession,
    SaveCheckpoint,
)
from suzumio.contracts.envelope import DomainEvent
from suzumio.contracts.errors import ConflictError, ForbiddenError, InvalidError, id_taken
from suzumio.contracts.events import (
    ActivationCancelRequested,
    ActivationRequested,
    CheckpointSaved,
    HistoryCompacted,
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
DEFAULT_MESSAGE_PRIORITY = {  # DESIGN.md §6: double texting has defined semantics
    "user": DEFAULT_USER_MESSAGE_PRIORITY,
    "agent": Priority.P2,  # agent to agent
    "system": Priority.P3,  # a toolpack's routine work
}

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
        self.entries: dict[str, int] = {}  # history message id -> its place (retries skip)
        self.checkpoints: set[str] = set()
        self.fenced: set[str] = set()  # activations cancelled (or replaced by a P0)
        self.work_cancelled: set[str] = set()  # cancelled by a person: their work goes too
        self.latest: str | None = None  # the last activation requested: the only one to write

    @property
    def weight(self) -> int:
        return 1 + sum(
            map(
                len,
                (
                    self.signals,
                    self.resumed,
                    self.entries,
                    self.checkpoints,
                    self.fenced,
                    self.work_cancelled,
                ),
            )
        )

    def apply(self, data: DomainEvent) -> None:  # noqa: C901 - one branch per event type
        match data:
            case SessionOpened():
                self.project_id, self.agent_id = data.project_id, data.agent_id
            case SessionMessageAppended():
                self.entries.setdefault(data.message_id, len(self.entries))
            case HistoryCompacted():  # the summary stands where the range ended
                place = self.entries.get(data.archived_through, len(self.entries))
                self.entries.setdefault(data.marker_id, place)
            case CheckpointSaved():
                self.checkpoints.add(data.checkpoint_id)
            case SessionClosed():
                self.closed = True
            case SessionReopened():
                self.closed = False
            case ActivationCancelRequested():
                self.fenced.add(data.activation_id)
                if data.closes_work:
                    self.work_cancelled.add(data.activation_id)
            case ActivationRequested():
                self.latest = data.activation_id
            case SignalRecorded():
                self.signals.add(data.signal_id)
                action = data.payload.get("pending_action_id")
                if isinstance(action, str) and data.kind not in USER_SIGNAL_KINDS:
                    self.resumed.add(action)


def open_(state: SessionState, agent: AgentState, cmd: OpenSession) -> list[DomainEvent]:
    if state.exists:
        raise id_taken("a session")
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
    """A message to the session's agent and the signal that tells it. By default a user's
    message is P1, another agent's P2, the platform's (a toolpack's scheduler hook) P3."""
    # Ids first: a retry of a message recorded before the session closed is told it exists
    # (and taken as done), not that the session is closed (and taken as failed).
    if cmd.signal_id in state.signals:
        raise id_taken("a signal")
    if cmd.message_id in state.entries:  # a second one would break the read model's key
        raise id_taken("a message")
    if cmd.activation_id is not None:  # an agent writing to its own session (`record_signal`)
        _live(state, cmd.activation_id)
    _writable(state)
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
        priority=cmd.priority or DEFAULT_MESSAGE_PRIORITY[author.kind],
        message_id=cmd.message_id,
    )
    return [message, signal]


def record_signal(state: SessionState, cmd: RecordSignal, *, by_user: bool) -> list[DomainEvent]:
    if by_user and cmd.kind not in USER_SIGNAL_KINDS:
        raise ForbiddenError(f"{cmd.kind.value} signals are recorded by the platform")
    if cmd.signal_id in state.signals:  # before the closing: a retry is told it exists
        raise id_taken("a signal")
    if cmd.activation_id is not None:
        # An agent's own work for later, recorded through the tool-broker: on the state the
        # append is conditional on, so a cancel stored while the call was on its way stops it
        # — else a cancelled activation could queue the work the user had just stopped.
        _live(state, cmd.activation_id)
    _writable(state)
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


def fenced_because(state: SessionState, activation_id: str | None) -> str | None:
    """Why `activation_id` may no longer write to its session, if it may not: it was cancelled,
    or a later activation of the session was requested (the scheduler requests one only after
    the last one ended: a sandbox still writing then is a failed or timed-out attempt that
    lives on, and its entries would land among its retry's). None: no activation writes."""
    if activation_id is None:
        return None
    if activation_id in state.fenced:
        return "the activation is cancelled"
    if state.latest is not None and activation_id != state.latest:
        return "the activation is over: a later one of its session was requested"
    return None


def _live(state: SessionState, activation_id: str) -> None:
    """An activation writes to its session only while it is the session's live one. The
    tool-broker checks that before it asks; checked here too, on the state the append is
    conditional on, a cancel or a later request stored while the call was on its way is never
    overtaken."""
    reason = fenced_because(state, activation_id)
    if reason is not None:
        raise ForbiddenError(reason)


def append_history(state: SessionState, cmd: AppendHistory) -> list[DomainEvent]:
    """An activation's history entries; those recorded already (a retry) are skipped. A
    closed session still takes them: the activation ran while it was open. Entries of one
    command naming one message twice are refused whole: neither copy is the obvious one."""
    ids = [e.message_id for e in cmd.entries]
    if len(set(ids)) != len(ids):
        repeated = next(i for i in ids if ids.count(i) > 1)
        raise InvalidError(f"the entries repeat the message id {repeated}")
    new = [e for e in cmd.entries if e.message_id not in state.entries]
    if new:
        _live(state, cmd.activation_id)
    return [
        SessionMessageAppended(
            message_id=entry.message_id,
            author=Author(kind="agent", id=cmd.agent_id),
            role=entry.role,
            text=entry.text,
            activation_id=cmd.activation_id,
            tool_calls=entry.tool_calls,
            tool_call_id=entry.tool_call_id,
            name=entry.name,
        )
        for entry in new
    ]


def compact_history(state: SessionState, cmd: CompactHistory) -> list[DomainEvent]:
    if cmd.marker_id in state.entries:
        return []
    _live(state, cmd.activation_id)
    first, last = state.entries.get(cmd.archived_from), state.entries.get(cmd.archived_through)
    if first is None or last is None:
        raise InvalidError("the archived range names entries that are not in this session")
    # The runner's order may differ a little from the log's (a P1 message is logged when it
    # is posted, seen at the next tool boundary): the count is what the log spans.
    first, last = min(first, last), max(first, last)
    return [
        HistoryCompacted(
            activation_id=cmd.activation_id,
            marker_id=cmd.marker_id,
            summary=cmd.summary,
            archived_from=cmd.archived_from,
            archived_through=cmd.archived_through,
            archived_count=max(len(cmd.archived_ids), last - first + 1),
            archived_ids=tuple(i for i in cmd.archived_ids if i in state.entries),
            tokens_before=cmd.tokens_before,
            tokens_after=cmd.tokens_after,
        )
    ]


def save_checkpoint(state: SessionState, cmd: SaveCheckpoint) -> list[DomainEvent]:
    if cmd.checkpoint_id in state.checkpoints:
        return []
    _live(state, cmd.activation_id)
    return [
        CheckpointSaved(
            checkpoint_id=cmd.checkpoint_id, activation_id=cmd.activation_id, data=cmd.data
        )
    ]
