"""The session as it was when an activation was requested, from its subject of the log —
read, or folded as the orchestrator follows the log — never from projections, so a launch
sees every fact stored before its request, whatever the projector's lag: the active history
after the last compaction (its summary where the archived entries stood), the batch's signals
in the scheduler's order, the latest checkpoint. (The session's artifacts are aggregates of
their own: the directory folds them from the log, and where it cannot answer, they are read
from their projection, `session_artifacts`.)"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from suzumio.contracts.envelope import DomainEvent, EventEnvelope, RecordedEvent, decode_data
from suzumio.contracts.events import (
    ActivationRequested,
    CheckpointSaved,
    HistoryCompacted,
    SessionMessageAppended,
    SessionOpened,
    SignalClosed,
    SignalRecorded,
    SignalsDelivered,
)
from suzumio.contracts.runner import AgentHistoryMessage, CheckpointRef, SignalSpec, ToolCall
from suzumio.platform.bus.eventstore import EventStore, Head
from suzumio.platform.db.pool import Pool

SUMMARY_PREFIX = "[Summary of earlier conversation]"
REQUESTS_KEPT = 16  # requests whose signals a kept fold keeps (a retry names them again)


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
    # Where the batch's signals were stored (stream sequences, in the batch's order): whoever
    # asked for the work, whose trace the launch continues (`tracing`).
    origins: tuple[int, ...] = ()
    # The activations requested before with any of the batch's signals, or handed one while
    # they ran (a retry's earlier attempts), in the order they took them.
    earlier_attempts: tuple[str, ...] = ()
    # The messages of the batch's signals that an earlier attempt's compaction archived: in
    # the summary, not to be given again at the history's end (as if never seen).
    summarized: tuple[str, ...] = ()


@dataclass
class _SessionFold:
    """A session folded up to `head`, the last message folded (always whole: a request amid
    a message has its snapshot taken there, and the fold goes on)."""

    head: Head = field(default_factory=lambda: Head(0, 0))
    version: int = 0
    project_id: str = ""
    history: list[AgentHistoryMessage] = field(default_factory=list)
    # A posted message's text until its signal (the same commit) takes it: a runner's own
    # entries, tool outputs of up to 1 MB among them, are never looked up by a signal, and
    # kept here they outlived their compaction in every kept fold, copied at every plan.
    texts: dict[str, str] = field(default_factory=dict)
    signals: dict[str, SignalSpec] = field(default_factory=dict)
    origins: dict[str, int] = field(default_factory=dict)  # signal id -> its message's seq
    # Signal id -> the activations requested with it or handed it so far (let go with it).
    attempts: dict[str, list[str]] = field(default_factory=dict)
    # Signal id -> the activations whose compaction archived its message (let go with it).
    archived_by: dict[str, list[str]] = field(default_factory=dict)
    checkpoint: CheckpointRef | None = None
    # The signal ids of the session's last requests: a signal requested before and in none
    # of them is let go (its text may be a megabyte, and a long session posts thousands), as
    # is one closed. A request naming one let go has its snapshot read afresh (`complete`).
    requested: deque[tuple[str, ...]] = field(default_factory=lambda: deque(maxlen=REQUESTS_KEPT))
    prune: bool = True

    def copy(self) -> _SessionFold:
        return replace(
            self,
            history=list(self.history),
            texts=dict(self.texts),
            signals=dict(self.signals),
            origins=dict(self.origins),
            attempts={k: list(v) for k, v in self.attempts.items()},
            archived_by={k: list(v) for k, v in self.archived_by.items()},
            requested=deque(self.requested, maxlen=REQUESTS_KEPT),
        )

    def apply(self, event: RecordedEvent[DomainEvent]) -> None:
        if event.envelope.version <= self.version:
            return  # folded already
        self.version = event.envelope.version
        data = event.data
        match data:
            case SessionOpened():
                self.project_id = data.project_id
            case SessionMessageAppended():
                if data.activation_id is None:  # posted (by a user, an agent, a hook)
                    self.texts[data.message_id] = data.text
                self.history.append(_entry(data))
            case HistoryCompacted():
                gone = archived(self.history, data)
                self._archived(data.activation_id, gone)
                self.history = compacted(self.history, data, gone)
            case SignalRecorded():
                self.signals[data.signal_id] = SignalSpec(
                    id=data.signal_id,
                    kind=data.kind,
                    priority=data.priority,
                    payload=data.payload,
                    text=self.texts.pop(data.message_id or "", None),
                    message_id=data.message_id,
                )
                self.origins[data.signal_id] = event.seq
            case CheckpointSaved():
                self.checkpoint = CheckpointRef(
                    id=data.checkpoint_id, created_at=event.envelope.occurred_at, data=data.data
                )
            case ActivationRequested() | SignalsDelivered():
                self._took(data)
            case SignalClosed() if self.prune:
                self._forget(data.signal_id)

    def _archived(self, activation_id: str, gone: set[str]) -> None:
        for signal_id, signal in self.signals.items():
            if signal.message_id in gone:
                by = self.archived_by.setdefault(signal_id, [])
                if activation_id not in by:
                    by.append(activation_id)

    def _summarized(self, signal_id: str, request: ActivationRequested) -> bool:
        """Whether an earlier attempt at this very signal archived its message (one that
        archived another signal's message never worked on it: that message is the request's
        still)."""
        attempts = set(self.attempts.get(signal_id, ())) - {request.activation_id}
        return bool(attempts.intersection(self.archived_by.get(signal_id, ())))

    def _forget(self, signal_id: str) -> None:
        self.signals.pop(signal_id, None)
        self.origins.pop(signal_id, None)
        self.attempts.pop(signal_id, None)
        self.archived_by.pop(signal_id, None)

    def _worked_on(self, activation_id: str, signal_ids: Sequence[str]) -> None:
        for signal_id in signal_ids:
            if signal_id in self.signals:
                attempts = self.attempts.setdefault(signal_id, [])
                if activation_id not in attempts:
                    attempts.append(activation_id)

    def _took(self, data: ActivationRequested | SignalsDelivered) -> None:
        """An activation requested with signals, or handed them while it ran (a P1 at a
        tool boundary)."""
        self._worked_on(data.activation_id, data.signal_ids)
        if isinstance(data, ActivationRequested) and self.prune:
            self._let_go(self.requested[0] if len(self.requested) == REQUESTS_KEPT else ())
            self.requested.append(data.signal_ids)

    def _let_go(self, leaving: tuple[str, ...]) -> None:
        """The signals of the request leaving the kept ones, unless a later one names them."""
        still = {i for ids in list(self.requested)[1:] for i in ids}
        for signal_id in leaving:
            if signal_id not in still:
                self._forget(signal_id)

    def complete(self, request: ActivationRequested) -> bool:
        """Whether it still has every signal of `request` (else one was let go)."""
        return all(i in self.signals for i in request.signal_ids)

    def snapshot(self, request: ActivationRequested) -> SessionSnapshot:
        earlier = tuple(
            dict.fromkeys(
                a
                for i in request.signal_ids
                for a in self.attempts.get(i, ())
                if a != request.activation_id
            )
        )
        signals = tuple(self.signals[i] for i in request.signal_ids if i in self.signals)
        return SessionSnapshot(
            project_id=self.project_id,
            history=tuple(self.history),
            signals=signals,
            checkpoint=self.checkpoint,
            origins=tuple(self.origins[i] for i in request.signal_ids if i in self.origins),
            earlier_attempts=earlier,
            summarized=tuple(
                dict.fromkeys(
                    s.message_id
                    for s in signals
                    if s.message_id and self._summarized(s.id, request)
                )
            ),
        )


async def _read_on(
    store: EventStore,
    session_id: str,
    fold: _SessionFold,
    request: ActivationRequested,
    stored_at: int = 0,
) -> SessionSnapshot | None:
    """Fold every event of the session after `fold.head`, from a replica of the log holding
    it up to `stored_at` at least; the snapshot as the request found them (None when it is
    not among them: older than `fold.head`, or not there)."""
    events = (
        await store.load("session", session_id, after=fold.head, min_last_seq=stored_at)
    ).events
    taken: SessionSnapshot | None = None
    for i, event in enumerate(events):
        data = event.data
        if (
            taken is None
            and isinstance(data, ActivationRequested)
            and data.activation_id == request.activation_id
        ):
            if fold.prune and not fold.complete(request):
                # One of its signals was let go by this fold: the session read whole.
                return await load_session(store, session_id, request, stored_at)
            taken = fold.snapshot(request)
        fold.apply(event)
        if i + 1 == len(events) or events[i + 1].seq != event.seq:  # its message is whole
            fold.head = Head(event.envelope.version, event.seq)
    return taken


async def load_session(
    store: EventStore, session_id: str, request: ActivationRequested, stored_at: int = 0
) -> SessionSnapshot:
    """The session as it was when the activation was requested: the active history (after
    the last compaction, whose summary stands in for the archived range), the batch's signals
    in the scheduler's order and the latest checkpoint. `stored_at`: as for
    `SessionReader.snapshot`."""
    fold = _SessionFold(prune=False)
    snapshot = await _read_on(store, session_id, fold, request, stored_at)
    return snapshot or _unstored(fold, request, stored_at)


def _unstored(fold: _SessionFold, request: ActivationRequested, stored_at: int) -> SessionSnapshot:
    """The snapshot of a request not found on the session's subject: the session as it
    stands, for one never stored (a dry run). One stored (`stored_at`) that a read from a
    replica holding it did not find is an error: its snapshot would lack the signals it was
    requested for, and the runner would start on a batch without them."""
    if stored_at:
        raise SessionReadError(
            f"activation {request.activation_id}, stored at {stored_at}, is not on the "
            "session's subject"
        )
    return fold.snapshot(request)


class SessionReadError(Exception):
    """A request stored in the log was not found where it was stored."""


class SessionReader:
    """`load_session` for a long-lived planner: the folds of the sessions planned most
    recently are kept, so the next request of a session reads only the events stored since
    its last one, not the whole session again (which grows with every turn) — and, where
    the log is followed (`observe`), nothing at all: a kept fold is folded on as the log
    delivers the session's messages, and a request's snapshot is taken as it goes by."""

    def __init__(self, store: EventStore, keep: int = 128, taken: int = 256) -> None:
        self._store = store
        self._keep = keep
        self._folds: OrderedDict[str, _SessionFold] = OrderedDict()
        # Snapshots taken as requests went by, until their plans ask or they end unplanned
        # (`forget`: cancelled first, say); bounded all the same, as each holds a history.
        self._taken: OrderedDict[str, tuple[ActivationRequested, SessionSnapshot]] = OrderedDict()
        self._keep_taken = taken

    def keeps(self, session_id: str) -> bool:
        return session_id in self._folds

    def observe(self, session_id: str, seq: int, envelopes: Sequence[EventEnvelope]) -> None:
        """A message of the session's subject, as the followed log delivers it (in order):
        folded into the session's kept fold if it comes right after it; a fold it cannot
        continue is dropped (the next plan reads instead, and meets what failed here)."""
        fold = self._folds.get(session_id)
        if fold is None or not envelopes or envelopes[0].version != fold.head.version + 1:
            return  # not kept, or a message it missed (it was read meanwhile): read on asking
        try:
            for envelope in envelopes:
                event = RecordedEvent(envelope, decode_data(envelope), seq)
                if isinstance(event.data, ActivationRequested) and fold.complete(event.data):
                    self._take(event.data, fold.snapshot(event.data))
                fold.apply(event)
        except Exception:
            del self._folds[session_id]
            return
        fold.head = Head(envelopes[-1].version, seq)

    def forget(self, activation_id: str) -> None:
        """The activation ended: its snapshot, if its plan never took it, is not needed."""
        self._taken.pop(activation_id, None)

    def _take(self, request: ActivationRequested, snapshot: SessionSnapshot) -> None:
        self._taken[request.activation_id] = (request, snapshot)
        while len(self._taken) > self._keep_taken:
            self._taken.popitem(last=False)

    async def snapshot(
        self, session_id: str, request: ActivationRequested, stored_at: int = 0
    ) -> SessionSnapshot:
        """The session as `request` found it. `stored_at`: the log's sequence of the message
        that stored it (0: never stored, a dry run); the session is read from a replica of
        the log that holds it — a Direct Get of a replicated stream may be answered by a
        follower behind the leader, where the request is not yet (its snapshot then lacked
        the signals it was requested for) — and a request not found there is an error."""
        taken = self._taken.pop(request.activation_id, None)
        if taken is not None and taken[0] == request:
            return taken[1]
        cached = self._folds.get(session_id)
        fold = cached.copy() if cached is not None else _SessionFold()
        snapshot = await _read_on(self._store, session_id, fold, request, stored_at)
        if snapshot is None and cached is not None:  # an older request than the one kept
            fold = _SessionFold()
            snapshot = await _read_on(self._store, session_id, fold, request, stored_at)
        if snapshot is None:
            return _unstored(fold, request, stored_at)
        kept = self._folds.get(session_id)  # folded on by `observe` meanwhile, perhaps
        if kept is None or fold.head.seq >= kept.head.seq:
            self._folds[session_id] = fold  # a copy of its own: nothing else holds it
            self._folds.move_to_end(session_id)
            while len(self._folds) > self._keep:
                self._folds.popitem(last=False)
        return snapshot


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
        activation_id=data.activation_id,
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


async def session_closed_at(pool: Pool, session_id: str, seq: int) -> float | None:
    """When the session was closed, if the read model has it closed and has applied the log
    up to `seq` at least (else None: open, or the read model behind — a reopening it has not
    shown yet must not count as closed). Where the read model stands, not the row's version:
    that is the version of the last event the read model takes, and a closed session's log
    may end with one it does not (a cancel, a checkpoint), which left its directory for good."""
    closed = await pool.fetchval(
        "SELECT s.closed_at FROM proj_sessions.sessions s"
        " JOIN suzumio.projection_checkpoints c ON c.name = 'sessions' AND c.position >= $2"
        " WHERE s.id = $1 AND s.status = 'closed'",
        session_id,
        seq,
    )
    return closed.timestamp() if closed is not None else None


def archived(history: list[AgentHistoryMessage], marker: HistoryCompacted) -> set[str]:
    """The ids of the entries `marker` archives."""
    if marker.archived_ids:
        return set(marker.archived_ids)
    # An older marker: everything up to the range's end.
    ids = [h.id for h in history]
    if marker.archived_through not in ids:
        return set()
    return {i for i in ids[: ids.index(marker.archived_through) + 1] if i}


def compacted(
    history: list[AgentHistoryMessage],
    marker: HistoryCompacted,
    gone: set[str] | None = None,
) -> list[AgentHistoryMessage]:
    """The history with the archived entries (`gone`, else `archived`'s) replaced by the
    summary, where they stood."""
    gone = archived(history, marker) if gone is None else gone
    place = next((i for i, h in enumerate(history) if h.id in gone), None)
    if place is None:
        return history
    kept = [h for h in history if h.id not in gone]
    summary = AgentHistoryMessage(
        id=marker.marker_id, role="user", content=f"{SUMMARY_PREFIX}\n{marker.summary}"
    )
    return [*kept[:place], summary, *kept[place:]]
