"""A session's timeline as one ordered feed: its durable events (history, signals, activation
requests) from EVENTS and its live output from LIVE, resumable from a cursor `E.L` (the last
EVENTS and LIVE sequences a client has seen)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import ConsumerConfig, DeliverPolicy

from suzumio.gateway.api.problems import ApiError
from suzumio.gateway.state import Gateway
from suzumio.platform.bus.jsapi import stream_last_seq

KEEPALIVE_SECONDS = 15.0
QUEUE_SIZE = 1_024
_CURSOR = re.compile(r"^(\d{1,19})\.(\d{1,19})$")


@dataclass
class Cursor:
    events: int = 0
    live: int | None = None  # None: from now on

    @staticmethod
    def parse(text: str | None) -> Cursor:
        if not text:
            return Cursor()
        match = _CURSOR.fullmatch(text.strip())
        if match is None:
            raise ApiError(422, "Last-Event-ID must look like '<events>.<live>' as sent before")
        return Cursor(int(match[1]), int(match[2]))

    def __str__(self) -> str:
        return f"{self.events}.{self.live or 0}"


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
    with an `end` item naming the reason."""

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
        self._queue: asyncio.Queue[tuple[str, Msg]] = asyncio.Queue(QUEUE_SIZE)
        self._subs: list[Subscription] = []

    async def open(self) -> None:
        try:
            await self._subscribe()
        except BaseException:
            await self.close()  # a half-open feed must not leak its first subscription
            raise

    async def _subscribe(self) -> None:
        js = self._gw.nc.jetstream()
        topology = self._gw.topology
        live_end = await stream_last_seq(self._gw.nc, topology.live_stream)
        if self.cursor.live is None or self.cursor.live > live_end:
            # From now on; also when the cursor is past the end: LIVE is kept in memory and
            # starts over at 1 after a server restart, so such a cursor names nothing.
            self.cursor.live = live_end if self.cursor.live is None else 0

        async def on_event(msg: Msg) -> None:
            await self._queue.put(("events", msg))

        async def on_live(msg: Msg) -> None:
            await self._queue.put(("live", msg))

        for subject, start, callback in (
            (topology.event_subject("session", self._session_id), self.cursor.events, on_event),
            (topology.live_subject(self._session_id), self.cursor.live, on_live),
        ):
            config = ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start + 1
            )
            self._subs.append(
                await js.subscribe(subject, ordered_consumer=True, config=config, cb=callback)
            )

    async def close(self) -> None:
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs.clear()

    async def items(self) -> AsyncIterator[Item | None]:
        """Timeline items as they come; None every `KEEPALIVE_SECONDS` of silence; a last
        `end` item when the caller lost access."""
        next_check = time.monotonic() + self._recheck_seconds
        last_out = time.monotonic()
        while True:
            wait = min(last_out + KEEPALIVE_SECONDS, next_check) - time.monotonic()
            msg: Msg | None
            try:
                source, msg = await asyncio.wait_for(self._queue.get(), max(wait, 0.0))
            except TimeoutError:
                source, msg = "", None
            if time.monotonic() >= next_check:
                try:
                    await self._recheck()
                except ApiError as exc:
                    reason = {"status": exc.status, "detail": exc.detail}
                    yield Item(None, "end", json.dumps(reason).encode())
                    return
                next_check = time.monotonic() + self._recheck_seconds
            if msg is None:
                if time.monotonic() >= last_out + KEEPALIVE_SECONDS:
                    last_out = time.monotonic()
                    yield None
                continue
            last_out = time.monotonic()
            seq = msg.metadata.sequence.stream
            if source == "live":
                self.cursor.live = seq
                yield Item(str(self.cursor), "live", msg.data)
                continue
            parts = _events(msg.data)
            self.cursor.events = seq
            for i, (event, data) in enumerate(parts):
                yield Item(str(self.cursor) if i == len(parts) - 1 else None, event, data)


def _events(data: bytes) -> list[tuple[str, bytes]]:
    """(type, envelope JSON) of each event a log message holds."""
    if data[:1] != b"[":
        return [(_type_of(json.loads(data)), data)]
    return [(_type_of(e), json.dumps(e, separators=(",", ":")).encode()) for e in json.loads(data)]


def _type_of(envelope: object) -> str:
    return str(envelope.get("type", "event")) if isinstance(envelope, dict) else "event"
