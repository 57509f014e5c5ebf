"""The session as it was when an activation was requested, read from its subject of the log
(never from projections, so a launch sees every fact stored before its request, whatever the
projector's lag): the active history after the last compaction (its summary where the archived
entries stood), the batch's signals in the scheduler's order, the latest checkpoint. (The
session's artifacts are aggregates of their own: the directory folds them from the log, and
where it cannot answer, they are read from their projection, `session_artifacts`.)"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace

from suzumio.contracts.envelope import DomainEvent, RecordedEvent
from suzumio.contracts.events import (
    ActivationRequested,
    CheckpointSaved,
    HistoryCompacted,
    SessionMessageAppended,
    SessionOpened,
    SignalRecorded,
)
from suzumio.contracts.runner import AgentHistoryMessage, CheckpointRef, SignalSpec, ToolCall
from suzumio.platform.bus.eventstore import EventStore, Head
from suzumio.platform.db.pool import Pool

SUMMARY_PREFIX = "[Summary of earlier conversation]"


@dataclass(frozen=True)
class Artifact:
    id: str
    path: str
    sha256: str
    size: int


@dataclass
class SessionSnapshot:
    project_id: str
    history: tuple[AgentHistoryMessage, ...]
    signals: tuple[SignalSpec, ...]
    checkpoint: CheckpointRef | None


@dataclass
class _SessionFold:
    """A session folded up to `head`, the last whole message folded (a message may hold
    several events, and a request may stand amid them: what came before it in its message is
    folded, and `version` says how far, so reading on from `head` folds none twice)."""

    head: Head = field(default_factory=lambda: Head(0, 0))
    version: int = 0
    project_id: str = ""
    history: list[AgentHistoryMessage] = field(default_factory=list)
    texts: dict[str, str] = field(default_factory=dict)
    signals: dict[str, SignalSpec] = field(default_factory=dict)
    checkpoint: CheckpointRef | None = None

    def copy(self) -> _SessionFold:
        return replace(
            self, history=list(self.history), texts=dict(self.texts), signals=dict(self.signals)
        )

    def apply(self, event: RecordedEvent[DomainEvent]) -> None:
        if event.envelope.version <= self.version:
            return  # folded already, from the same message read before
        self.version = event.envelope.version
        data = event.data
        match data:
            case SessionOpened():
                self.project_id = data.project_id
            case SessionMessageAppended():
                self.texts[data.message_id] = data.text
                self.history.append(_entry(data))
            case HistoryCompacted():
                self.history = compacted(self.history, data)
            case SignalRecorded():
                self.signals[data.signal_id] = SignalSpec(
                    id=data.signal_id,
                    kind=data.kind,
                    priority=data.priority,
                    payload=data.payload,
                    text=self.texts.get(data.message_id or ""),
                    message_id=data.message_id,
                )
            case CheckpointSaved():
                self.checkpoint = CheckpointRef(
                    id=data.checkpoint_id, created_at=event.envelope.occurred_at, data=data.data
                )

    def snapshot(self, request: ActivationRequested) -> SessionSnapshot:
        return SessionSnapshot(
            project_id=self.project_id,
            history=tuple(self.history),
            signals=tuple(self.signals[i] for i in request.signal_ids if i in self.signals),
            checkpoint=self.checkpoint,
        )


async def _fold_until(
    store: EventStore, session_id: str, fold: _SessionFold, request: ActivationRequested
) -> bool:
    """Fold the session's events after `fold.head` up to (not including) the request; false
    when the request is not among them (it is older than `fold.head`, or not there)."""
    events = (await store.load("session", session_id, after=fold.head)).events
    for i, event in enumerate(events):
        data = event.data
        if isinstance(data, ActivationRequested) and data.activation_id == request.activation_id:
            return True
        fold.apply(event)
        if i + 1 == len(events) or events[i + 1].seq != event.seq:  # its message is whole
            fold.head = Head(event.envelope.version, event.seq)
    return False


async def load_session(
    store: EventStore, session_id: str, request: ActivationRequested
) -> SessionSnapshot:
    """The session as it was when the activation was requested: the active history (after
    the last compaction, whose summary stands in for the archived range), the batch's signals
    in the scheduler's order and the latest checkpoint."""
    fold = _SessionFold()
    await _fold_until(store, session_id, fold, request)
    return fold.snapshot(request)


class SessionReader:
    """`load_session` for a long-lived planner: the folds of the sessions planned most
    recently are kept, so the next request of a session reads only the events stored since
    its last one, not the whole session again (which grows with every turn)."""

    def __init__(self, store: EventStore, keep: int = 128) -> None:
        self._store = store
        self._keep = keep
        self._folds: OrderedDict[str, _SessionFold] = OrderedDict()

    async def snapshot(self, session_id: str, request: ActivationRequested) -> SessionSnapshot:
        cached = self._folds.get(session_id)
        fold = cached.copy() if cached is not None else _SessionFold()
        found = await _fold_until(self._store, session_id, fold, request)
        if not found and cached is not None:  # an older request than the one folded last
            fold = _SessionFold()
            found = await _fold_until(self._store, session_id, fold, request)
        if found and (cached is None or fold.head.seq >= cached.head.seq):
            self._folds[session_id] = fold.copy()  # plans may fold on from it concurrently
            self._folds.move_to_end(session_id)
            while len(self._folds) > self._keep:
                self._folds.popitem(last=False)
        return fold.snapshot(request)


def _entry(data: SessionMessageAppended) -> AgentHistoryMessage:
    role = data.role if data.role in {"system", "user", "assistant", "tool"} else "user"
    return AgentHistoryMessage(
        id=data.message_id,
        role=role,  # type: ignore[arg-type]
        content=data.text,
        tool_calls=tuple(
            ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in data.tool_calls
        ),
        tool_call_id=data.tool_call_id,
        name=data.name,
    )


async def session_artifacts(pool: Pool, session_id: str) -> dict[str, Artifact]:
    """The session's artifacts by path, newest per path (from the projection: artifacts are
    aggregates of their own, listed by session only there)."""
    rows = await pool.fetch(
        "SELECT DISTINCT ON (path) id, path, sha256, size FROM proj_artifacts.artifacts"
        " WHERE session_id = $1 AND deleted_at IS NULL ORDER BY path, position DESC",
        session_id,
    )
    return {r["path"]: Artifact(r["id"], r["path"], r["sha256"], r["size"]) for r in rows}


def compacted(
    history: list[AgentHistoryMessage], marker: HistoryCompacted
) -> list[AgentHistoryMessage]:
    """The history with the archived entries replaced by the summary, where they stood."""
    gone = set(marker.archived_ids)
    if not gone:  # an older marker: everything up to the range's end
        ids = [h.id for h in history]
        if marker.archived_through not in ids:
            return history
        gone = {i for i in ids[: ids.index(marker.archived_through) + 1] if i}
    place = next((i for i, h in enumerate(history) if h.id in gone), None)
    if place is None:
        return history
    kept = [h for h in history if h.id not in gone]
    summary = AgentHistoryMessage(
        id=marker.marker_id, role="user", content=f"{SUMMARY_PREFIX}\n{marker.summary}"
    )
    return [*kept[:place], summary, *kept[place:]]
