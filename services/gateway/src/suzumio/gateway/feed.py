"""A session's timeline as one ordered feed: its durable events (history, signals, activation
requests) from EVENTS and its live output from LIVE, resumable from a cursor `E.L` (the last
EVENTS and LIVE sequences a client has seen).

What a cursor names of either stream before the feed opened is read as the client takes it
(direct gets, a batch at a time); what comes after is pushed, into queues bounded in count and
in bytes. A client too slow for what its session produces overflows them and is let go, to
resume from its cursor. Catching up through a long log used to be pushed too, held back only
by the consumer's flow control — which nats-py lifts whatever was read, when the server's
heartbeat says the consumer stalled: a slow client reading a long log piled up to 256 MiB in
the gateway, per stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

from suzumio.gateway.api.problems import ApiError
from suzumio.gateway.state import Gateway
from suzumio.platform.bus.direct_get import StoredMessage, iter_subject
from suzumio.platform.bus.jsapi import stream_last_seq
from suzumio.platform.bus.ordered import ordered_from
from suzumio.platform.errors import PlatformError
from suzumio.platform.logging import get_logger

log = get_logger(__name__)

KEEPALIVE_SECONDS = 15.0
QUEUE_SIZE = 1_024
QUEUE_BYTES = 16 * 1024 * 1024  # of live chunks, and of log events, queued for one client
_CURSOR = re.compile(r"^(\d{1,19})\.(\d{1,19})(?:\.([0-9a-f]{8}))?$")
CLOSE_SECONDS = 10.0  # a feed's cleanup gives up on NATS after this (its consumer then expires)
RECHECK_RETRY_SECONDS = 1.0  # a recheck that could not be made is tried again this soon
RECHECK_FAILED = "the caller's access could not be checked; reconnect with Last-Event-ID"
HISTORY_FAILED = "the session's log could not be read; reconnect with Last-Event-ID"
_CLOSING: set[asyncio.Task[None]] = set()  # cleanups under way: held, so none is collected


@dataclass
class Cursor:
    """`E.L.G`: the last EVENTS and LIVE sequences a client has seen, and which LIVE the
    latter numbers (`G`, LIVE's generation: another one means LIVE was made again since, and
    `L` names nothing in it). `E.L` alone (a cursor made by hand, or from before the
    generation was given) is taken to be of the LIVE there is."""

    events: int = 0
    live: int | None = None  # None: from now on
    generation: str | None = None

    @staticmethod
    def parse(text: str | None) -> Cursor:
        if not text:
            return Cursor()
        match = _CURSOR.fullmatch(text.strip())
        if match is None:
            raise ApiError(
                422, "Last-Event-ID must be a cursor as sent before ('<events>.<live>.<gen>')"
            )
        return Cursor(int(match[1]), int(match[2]), match[3])

    def __str__(self) -> str:
        cursor = f"{self.events}.{self.live or 0}"
        return f"{cursor}.{self.generation}" if self.generation else cursor


@dataclass(frozen=True)
class Item:
    """One timeline entry. `cursor` is set on the last item of a log message only: resuming
    from it must not skip the rest of a commit of several events."""

    cursor: str | None
    event: str
    data: bytes


Recheck = Callable[[], Awaitable[None]]


class SessionFeed:
    """`recheck` runs every `recheck_seconds` while the feed is open and raises ApiError once
    the caller may no longer watch (key revoked, membership removed): the feed then ends
    with an `end` item naming the reason. Live output comes from the gateway's shared
    `LiveHub`; what the cursor names before the hub's start is read from LIVE directly."""

    def __init__(
        self,
        gw: Gateway,
        session_id: str,
        cursor: Cursor,
        recheck: Recheck,
        recheck_seconds: float = KEEPALIVE_SECONDS,
    ) -> None:
        self._gw = gw
        self._session_id = session_id
        self.cursor = cursor
        self._recheck = recheck
        self._recheck_seconds = recheck_seconds
        # One queue keeps the two kinds in arrival order; each kind has its own bound, in
        # count and in bytes (one log message or chunk may be as large as the bus carries).
        # Neither waits for room: too many queued means this client reads more slowly than
        # its session writes (a catch-up does not count: it is read, not queued).
        self._queue: asyncio.Queue[tuple[str, int, bytes]] = asyncio.Queue()
        # Log events taken off the queue during the catch-up, which come after it (in order).
        self._held: deque[tuple[str, int, bytes]] = deque()
        self._events_queued = 0
        self._event_bytes = 0
        self._live_queued = 0
        self._live_bytes = 0
        self._sub: Subscription | None = None
        self._joined = False
        self._overflowed = False
        self._joined_at = 0  # the hub hands over every LIVE message after this sequence
        self._log_end = 0  # the log's consumer pushes every message after this sequence
        self._next_check = 0.0  # when the caller's access is checked next
        self._ended = False
        self._checked_at = time.monotonic()  # the caller's access, last found to stand

    async def open(self) -> None:
        try:
            await self._subscribe()
        except BaseException:
            await self.close()  # a half-open feed must not leak its subscriptions
            raise

    async def _subscribe(self) -> None:
        topology = self._gw.topology
        self._log_end = await stream_last_seq(self._gw.nc, topology.events_stream)
        if self.cursor.events > self._log_end:
            # EVENTS is durable and never numbers again: a cursor past its end was never given
            # out, and the consumer would wait there for ever, silently skipping every event
            # the session gets meanwhile.
            raise ApiError(422, "Last-Event-ID names a log position beyond the end of the log")
        self._joined_at = await self._gw.live.join(self._session_id, self)
        self._joined = True
        generation = self._gw.live.generation(self._session_id)
        if self.cursor.live is None:
            self.cursor.live = self._joined_at  # from now on
        elif self.cursor.generation not in (None, generation):
            # LIVE was made again since the cursor was given (a NATS restart), and numbers
            # from 1 anew: everything of the session's it holds now is after the cursor — by
            # its sequence alone, a busy LIVE already past it would have skipped some.
            self.cursor.live = 0
        elif self.cursor.live > self._joined_at and self.cursor.live > await stream_last_seq(
            self._gw.nc, topology.live_stream
        ):
            # LIVE is kept in memory and numbers from 1 again after a server restart: a cursor
            # past its end names nothing still there, so start from what LIVE holds. (Past the
            # hub's start only, it may come from another gateway, whose channel for the
            # session opened later: everything up to it was sent already.)
            self.cursor.live = 0
        self.cursor.generation = generation

        async def on_event(msg: Msg) -> None:
            self.take_event(msg.metadata.sequence.stream, msg.data)

        # From where the log ended: what the cursor names before it is read by `_history`.
        self._sub = await ordered_from(
            self._gw.nc,
            topology.event_subject("session", self._session_id),
            self._log_end + 1,
            on_event,
        )

    def take_event(self, seq: int, data: bytes) -> None:
        """One log message of this session's subject, stored after the feed opened. Past
        QUEUE_SIZE, or QUEUE_BYTES, queued (a message larger than that alone fits an empty
        queue), the client fell behind: the feed ends, to be resumed from its cursor."""
        if not self._fits_event(len(data)):
            self._overflowed = True
            return
        self._events_queued += 1
        self._event_bytes += len(data)
        self._queue.put_nowait(("events", seq, data))

    def _fits_event(self, size: int) -> bool:
        return self._events_queued == 0 or (
            self._events_queued < QUEUE_SIZE and self._event_bytes + size <= QUEUE_BYTES
        )

    def deliver(self, seq: int, data: bytes) -> None:
        """From the hub: one LIVE message of this session."""
        if self._live_queued >= QUEUE_SIZE or self._live_bytes + len(data) > QUEUE_BYTES:
            self._overflowed = True  # the client reads too slowly; it resumes from its cursor
            return
        self._live_queued += 1
        self._live_bytes += len(data)
        self._queue.put_nowait(("live", seq, data))

    def restarted(self) -> None:
        """From the hub: LIVE was made again and numbers from 1. This client's cursor is in
        the old numbering, and what the new LIVE got before the hub noticed is not handed
        over: the stream ends, and a reconnect reads the new LIVE from its start."""
        self._queue.put_nowait(("restart", 0, b""))  # in order: what came before still goes

    def closing(self) -> None:
        """From the hub: this gateway is shutting down. What is queued still goes; then the
        stream ends, and the client reconnects (to another replica) from its cursor."""
        self._queue.put_nowait(("closing", 0, b""))

    async def close(self) -> None:
        """Leave the hub and end the log's consumer. Safe from a task being cancelled — a
        client gone: Starlette cancels the response's task, and anyio cancels every await in
        it again, the ones of a `finally` too. Nothing more is handed to this feed from here
        on, and the rest runs to its end in a task of its own (bounded), however this one
        ends."""
        sub, self._sub = self._sub, None
        joined, self._joined = self._joined, False
        if joined:
            self._gw.live.forget(self._session_id, self)
        if sub is None and not joined:
            return
        cleanup = asyncio.ensure_future(self._end(sub, joined=joined))
        _CLOSING.add(cleanup)
        cleanup.add_done_callback(_CLOSING.discard)
        await asyncio.shield(cleanup)

    async def _end(self, sub: Subscription | None, *, joined: bool) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CLOSE_SECONDS):
                if sub is not None:  # first: it needs no lock, and holds a server consumer
                    with contextlib.suppress(Exception):  # the hub's leave comes all the same
                        await sub.unsubscribe()
                if joined:
                    await self._gw.live.leave(self._session_id, self)

    async def _backlog(self) -> AsyncIterator[Item]:
        """LIVE messages after the cursor, up to where the hub took over."""
        after = self.cursor.live or 0
        if after >= self._joined_at:
            return
        async for stored in iter_subject(
            self._gw.nc,
            self._gw.topology.live_stream,
            self._gw.topology.live_subject(self._session_id),
            after_seq=after,
            # Up to where the hub took over, from a replica that holds that much (LIVE is
            # replicated in a cluster: a lagging follower would end the backlog early, and
            # what lies between would never be sent).
            min_last_seq=self._joined_at,
        ):
            if stored.seq > self._joined_at:
                break
            self.cursor.live = stored.seq
            yield Item(str(self.cursor), "live", stored.data)

    async def _caught_up(self) -> AsyncIterator[Item]:
        """What the cursor names of LIVE and of the log before the feed opened, as read; a
        last `end` item (and `_ended`) when that could not be read, the caller lost access,
        or the gateway shuts down meanwhile. Live output that comes meanwhile goes between
        log messages (else a long catch-up on a busy session overflowed its queue)."""
        try:
            async for item in self._backlog():
                yield item
        except PlatformError:  # a 412: LIVE behind the join point (made again meanwhile)
            yield self._ending(_ENDINGS["restart"])
            return
        self._next_check = time.monotonic() + self._recheck_seconds
        async with contextlib.aclosing(self._history()) as history:  # its batch let go at once
            while True:
                try:
                    stored = await anext(history, None)
                except (PlatformError, NatsError, TimeoutError, OSError) as exc:
                    log.warning("stream.history_failed", session=self._session_id, error=repr(exc))
                    yield self._ending(HISTORY_FAILED)
                    return
                if stored is None:
                    return
                for item in self._render("events", stored.seq, stored.data):
                    yield item
                async for item in self._meanwhile():  # after the whole message (a commit)
                    yield item
                if self._ended:
                    return

    async def _meanwhile(self) -> AsyncIterator[Item]:
        """During the catch-up: the live chunks queued, a shutdown or a LIVE restart (its
        `end`), and the access check when due. Log events queued are held for after it."""
        while not self._queue.empty():
            entry = self._queue.get_nowait()
            if (ending := _ENDINGS.get(entry[0])) is not None:
                yield self._ending(ending)
                return
            if entry[0] == "events":
                self._held.append(entry)
                continue
            self._live_queued -= 1
            self._live_bytes -= len(entry[2])
            for item in self._render(*entry):
                yield item
        if (refused := await self._check_due()) is not None:
            self._ended = True
            yield refused

    def _ending(self, detail: str) -> Item:
        self._ended = True
        return _end(503, detail)

    async def _history(self) -> AsyncGenerator[StoredMessage, None]:
        """The session's log messages after the cursor, up to where the consumer took over."""
        if self.cursor.events >= self._log_end:
            return
        async for stored in iter_subject(
            self._gw.nc,
            self._gw.topology.events_stream,
            self._gw.topology.event_subject("session", self._session_id),
            after_seq=self.cursor.events,
            min_last_seq=self._log_end,  # a lagging replica must not end it early
        ):
            if stored.seq > self._log_end:
                return
            yield stored

    async def items(self) -> AsyncIterator[Item | None]:
        """Timeline items as they come; None every `KEEPALIVE_SECONDS` of silence; a last
        `end` item when the caller lost access or fell too far behind."""
        async for item in self._caught_up():
            yield item
        if self._ended:
            return
        last_out = time.monotonic()
        while not self._overflowed:
            entry = await self._next(min(last_out + KEEPALIVE_SECONDS, self._next_check))
            ending = _ENDINGS.get(entry[0]) if entry is not None else None
            if ending is not None:  # after what came before it
                yield _end(503, ending)
                return
            if (refused := await self._check_due()) is not None:
                yield refused
                return
            if entry is None:
                if time.monotonic() >= last_out + KEEPALIVE_SECONDS:
                    last_out = time.monotonic()
                    yield None
                continue
            last_out = time.monotonic()
            for item in self._render(*entry):
                yield item
        yield _end(503, "the client fell behind; reconnect with Last-Event-ID")

    async def _next(self, deadline: float) -> tuple[str, int, bytes] | None:
        if self._held:
            entry = self._held.popleft()
            self._events_queued -= 1
            self._event_bytes -= len(entry[2])
            return entry
        try:
            entry = await asyncio.wait_for(self._queue.get(), max(deadline - time.monotonic(), 0))
        except TimeoutError:
            return None
        if entry[0] == "live":
            self._live_queued -= 1
            self._live_bytes -= len(entry[2])
        elif entry[0] == "events":
            self._events_queued -= 1
            self._event_bytes -= len(entry[2])
        return entry

    async def _check_due(self) -> Item | None:
        """The stream's `end` if the caller's access, checked when due, no longer stands."""
        if time.monotonic() < self._next_check:
            return None
        refused, wait = await self._refused()
        self._next_check = time.monotonic() + wait
        return refused

    async def _refused(self) -> tuple[Item | None, float]:
        """The stream's `end` if the caller may no longer watch; and when to check next."""
        try:
            await self._recheck()
        except ApiError as exc:
            if exc.status < 500:
                return _end(exc.status, exc.detail), 0.0
            return self._unchecked(exc)
        except Exception as exc:
            return self._unchecked(exc)
        self._checked_at = time.monotonic()
        return None, self._recheck_seconds

    def _unchecked(self, exc: Exception) -> tuple[Item | None, float]:
        """A check that could not be made — Postgres or NATS in trouble for a moment, a 503
        of the log's answer while a read model is frozen: access stood at the last check,
        and cutting every stream of the gateway at once (with no `end`, as it did) had them
        all reconnect together. Checked again soon; ended once none passed for two
        intervals."""
        log.warning("stream.recheck_failed", session=self._session_id, error=repr(exc))
        if time.monotonic() - self._checked_at >= 2 * self._recheck_seconds:
            return _end(503, RECHECK_FAILED), 0.0
        return None, min(RECHECK_RETRY_SECONDS, self._recheck_seconds)

    def _render(self, source: str, seq: int, data: bytes) -> list[Item]:
        if source == "live":
            if seq <= (self.cursor.live or 0):
                return []  # read from the backlog already
            self.cursor.live = seq
            return [Item(str(self.cursor), "live", data)]
        if seq <= self.cursor.events:
            return []  # sent already (a consumer made again replays from where it began)
        parts = _events(data)
        self.cursor.events = seq
        last = len(parts) - 1
        return [
            Item(str(self.cursor) if i == last else None, event, body)
            for i, (event, body) in enumerate(parts)
        ]


# Queue entries that end a stream (503, to be resumed from the cursor), and why.
_ENDINGS = {
    "restart": "live output was restarted; reconnect with Last-Event-ID",
    "closing": "this gateway is shutting down; reconnect with Last-Event-ID",
}


def _end(status: int, detail: str) -> Item:
    return Item(None, "end", json.dumps({"status": status, "detail": detail}).encode())


def _events(data: bytes) -> list[tuple[str, bytes]]:
    """(type, envelope JSON) of each event a log message holds."""
    if data[:1] != b"[":
        return [(_type_of(json.loads(data)), data)]
    return [(_type_of(e), json.dumps(e, separators=(",", ":")).encode()) for e in json.loads(data)]


def _type_of(envelope: object) -> str:
    return str(envelope.get("type", "event")) if isinstance(envelope, dict) else "event"
