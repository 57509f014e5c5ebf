"""Which activations are live, as the log tells it: the broker's fencing.

A valid token is not enough: the activation it names must still be live — requested, not
cancelled (a cancel or a P0 fences it at once), not ended. Every broker replica follows the
log from a little before the oldest token that can still be valid, so it never needs the
whole history; before acting on a call it makes sure it has folded everything stored up to
the moment the call arrived, so a cancel appended before the call is always seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from nats.aio.client import Client as NATS

from suzumio.contracts.envelope import decode_data
from suzumio.contracts.events import (
    ActivationCancelRequested,
    ActivationOutputRecorded,
    ActivationRequested,
    ToolCallFinished,
    ToolCallStarted,
)
from suzumio.contracts.events.activation import TERMINAL_ACTIVATION_EVENTS
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.direct_get import first_since
from suzumio.platform.bus.eventstore import EventStore, Head, envelopes_of
from suzumio.platform.bus.follower import LogFollower, LogMessage
from suzumio.platform.bus.jsapi import stream_last_seq
from suzumio.platform.logging import get_logger
from suzumio.platform.position import Position

log = get_logger(__name__)

SUPERSEDED = "over: a later activation of its session was requested"
WANTED = frozenset(
    {
        ActivationRequested.event_type,
        ActivationCancelRequested.event_type,
        ActivationOutputRecorded.event_type,
        ToolCallStarted.event_type,
        ToolCallFinished.event_type,
        *TERMINAL_ACTIVATION_EVENTS,
    }
)


@dataclass
class LiveActivation:
    id: str
    session_id: str
    agent_id: str
    project_id: str | None
    fenced: str = ""  # why it may no longer act; empty while live
    output: bool = False
    version: int | None = None  # of its own subject, as this replica last wrote it
    logged: int = 0  # of its own subject, as far as this replica folded the log
    logged_seq: int = 0  # the stream sequence of that version's message
    calls_started: set[str] = field(default_factory=set)
    calls_finished: set[str] = field(default_factory=set)
    # The tool of each call started and not finished (its finish's metric names it).
    call_tools: dict[str, str] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # its own appends, in order
    live_bytes: int = 0  # published to LIVE for it by this replica
    # Its latest batches counted in `live_bytes` (at most `LIVE_BATCHES_KEPT`), by number: how
    # many of its chunks LIVE knows the ids of, and when (monotonic) it stored the oldest. A
    # batch sent again after its answer was lost is counted once: LIVE stores none of it again.
    live_counted: dict[int, tuple[int, float]] = field(default_factory=dict)
    live_cut: bool = False  # past its live budget: nothing more of it is published
    log_bytes: int = 0  # charged to its log budget by this replica (history, checkpoints...)


class ActivationRegistry:
    def __init__(self, nc: NATS, topology: Topology, lookback: timedelta) -> None:
        self._nc = nc
        self._topology = topology
        self._lookback = lookback
        self._follower: LogFollower | None = None
        self._activations: dict[str, LiveActivation] = {}
        self._latest: dict[str, str] = {}  # session -> its last activation requested
        self._ended: deque[tuple[float, str]] = deque()  # forgotten after the look-back
        self.folded = Position()
        self._task: asyncio.Task[None] | None = None
        self._activation_prefix = topology.event_subject("activation", "")

    async def start(self) -> None:
        stream = self._topology.events_stream
        last = await stream_last_seq(self._nc, stream)
        first = await first_since(self._nc, stream, datetime.now(UTC) - self._lookback)
        # None: nothing stored since the look-back began, up to `last` at least (read first).
        start = first.seq if first is not None else last + 1
        # What lies before the look-back counts as folded (an activation of it is recalled):
        # else, with no message in the look-back, nothing would move the position until the
        # log's next event — the start waited a minute, then every call was 503.
        await self.folded.advance(start - 1)
        self._follower = LogFollower(self._nc, self._topology, start_seq=start)
        end = await self._follower.start()
        self._task = asyncio.create_task(self._fold_loop())
        await self.folded.reached(end, 60.0)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._follower is not None:
            await self._follower.close()

    def get(self, activation_id: str) -> LiveActivation | None:
        return self._activations.get(activation_id)

    async def recall(self, store: EventStore, activation_id: str, session_id: str) -> None:
        """Fold an activation older than the look-back from its own subjects (a long-lived
        token whose activation began before this replica followed the log)."""
        if activation_id in self._activations:
            return
        heads = await self._recall_from(store, activation_id, session_id, {})
        if activation_id in self._activations:
            # The fold loop dropped what it met for the activation while it was still unknown
            # here (a cancel or its end stored while the subjects were read, perhaps after the
            # read): read what came since, now that the loop folds the rest itself.
            await self._recall_from(store, activation_id, session_id, heads)

    async def _recall_from(
        self, store: EventStore, activation_id: str, session_id: str, after: dict[str, Head]
    ) -> dict[str, Head]:
        heads: dict[str, Head] = {}
        floor = await store.last_position() if self._replicated else 0  # as `fresh` reads
        for aggregate, aggregate_id in (("session", session_id), ("activation", activation_id)):
            stream = await store.load(
                aggregate, aggregate_id, after=after.get(aggregate), min_last_seq=floor
            )
            for event in stream.events:
                data = event.data
                if event.envelope.type not in WANTED:
                    continue
                if getattr(data, "activation_id", activation_id) == activation_id:
                    self._apply(aggregate_id, data, recalled=True)
                elif isinstance(data, ActivationRequested):
                    # Another activation of the session requested after this one (which the
                    # subject holds first): this one is over, as `_apply` has it.
                    recalled = self._activations.get(activation_id)
                    if recalled is not None:
                        recalled.fenced = recalled.fenced or SUPERSEDED
            heads[aggregate] = Head(stream.version, stream.seq)
        return heads

    async def fresh(self, store: EventStore, session_id: str, timeout: float = 5.0) -> bool:
        """Fold the session's subject up to now — where a cancel or a P0 is written — so a
        fence stored before this moment is seen; False if that took longer than `timeout`.
        (Waiting for the whole log would also wait for the broker's own audit appends.) On a
        replicated log, its head is read from a replica holding every write acknowledged: a
        follower behind answered without a cancel acknowledged a moment ago, and the call
        it fences went through. (One server holds them all: no look-up of the log's end.)"""
        head = await store.head("session", session_id, latest=self._replicated)
        return await self.folded.reached(head.seq, timeout)

    @property
    def _replicated(self) -> bool:
        return self._topology.replicas > 1

    async def _fold_loop(self) -> None:
        assert self._follower is not None
        while True:
            msg = await self._follower.next(timeout=None)
            position = self.folded.value
            while msg is not None:  # fold what is queued before waking the waiters
                folded = True
                if WANTED.intersection(msg.types):
                    folded = self._fold_message(msg)
                if folded and msg.subject.startswith(self._activation_prefix):
                    # Only a version whose every event was folded: a write on top of it relies
                    # on none of them having ended the activation (see `append_own`).
                    a = self._activations.get(msg.subject[len(self._activation_prefix) :])
                    if a is not None and msg.version > a.logged:
                        a.logged, a.logged_seq = msg.version, msg.seq
                position = msg.seq
                msg = self._follower.next_nowait()
            self._forget_ended()
            await self.folded.advance(position)

    def _fold_message(self, msg: LogMessage) -> bool:
        """Fold the wanted events of one message; False if any could not be read. Each event on
        its own: one that cannot be (a newer release's, mid-upgrade) must not take the others
        of its commit with it — a cancel or an end among them, and the activation acted on."""
        try:
            envelopes = envelopes_of(msg.data)
        except Exception:  # one bad message must not stop the fencing
            log.exception("registry.undecodable", seq=msg.seq)
            return False
        folded = True
        for envelope in envelopes:
            if envelope.type not in WANTED:
                continue
            try:
                self._apply(envelope.aggregate_id, decode_data(envelope))
            except Exception:
                log.exception("registry.undecodable", seq=msg.seq, type=envelope.type)
                folded = False
        return folded

    def _forget_ended(self) -> None:
        horizon = time.monotonic() - self._lookback.total_seconds()
        while self._ended and self._ended[0][0] < horizon:
            _, activation_id = self._ended.popleft()
            forgotten = self._activations.pop(activation_id, None)
            if forgotten is not None and self._latest.get(forgotten.session_id) == activation_id:
                del self._latest[forgotten.session_id]

    def _requested(self, session_id: str, data: ActivationRequested, *, recalled: bool) -> None:
        if data.activation_id not in self._activations:  # a recall must not reset one
            self._activations[data.activation_id] = LiveActivation(
                data.activation_id, session_id, data.agent_id, data.project_id
            )
        if recalled:
            # An old request read again: the session's later ones (which `_latest` may know)
            # come after it, and fence it there (`_recall_from`), never it them.
            return
        # The scheduler requests a session's next activation only once its last one ended:
        # one still calling then is an ended attempt that lives on (its end may not be folded
        # here yet, being on its own subject, which `fresh` does not wait for), and must not
        # write among its successor's.
        before = self._latest.get(session_id)
        self._latest[session_id] = data.activation_id
        earlier = self._activations.get(before) if before else None
        if earlier is not None and earlier.id != data.activation_id:
            earlier.fenced = earlier.fenced or SUPERSEDED

    def _apply(self, aggregate_id: str, data: object, *, recalled: bool = False) -> None:
        if isinstance(data, ActivationRequested):
            self._requested(aggregate_id, data, recalled=recalled)
            return
        target = data.activation_id if isinstance(data, ActivationCancelRequested) else aggregate_id
        a = self._activations.get(target)
        if a is None:
            return
        match data:
            case ActivationCancelRequested():
                a.fenced = a.fenced or "cancelled"
            case ActivationOutputRecorded():
                a.output = True
            case ToolCallStarted():
                a.calls_started.add(data.call_id)
                if data.call_id not in a.calls_finished:
                    a.call_tools[data.call_id] = data.tool
            case ToolCallFinished():
                a.calls_finished.add(data.call_id)
                a.call_tools.pop(data.call_id, None)
            case _:  # a terminal event
                a.fenced = "ended"
                # Kept for the look-back (a day) so that its token is refused as ended, not
                # unknown; its calls no route reads any more (the gate refuses it first), and
                # every replica would hold those of all activations of that day.
                a.calls_started, a.calls_finished, a.call_tools = set(), set(), {}
                self._ended.append((time.monotonic(), a.id))
