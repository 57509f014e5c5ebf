"""One LIVE subscription per watched session per gateway, shared by every stream of it.

A session watched by a hundred browsers costs one ordered consumer, not a hundred: each
message is received, sequenced and handed to every listener once. A listener that cannot keep
up is told so (and its stream ends, to be resumed from its cursor) instead of slowing the rest.

LIVE is a memory stream: a restarted NATS server loses it, a service makes it again, and it
numbers from 1 again. The ordered consumer would go on waiting after the old numbering's end,
for ever as far as the session's watchers go, so the hub looks at LIVE every `CHECK_SECONDS`:
a session's channel from before is opened again on the new stream and its listeners told.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from suzumio.contracts.subjects import Topology
from suzumio.gateway.api.problems import ApiError
from suzumio.platform.bus.jsapi import API_PREFIX, request
from suzumio.platform.bus.ordered import ordered_from
from suzumio.platform.logging import get_logger
from suzumio.platform.turns import Turns

log = get_logger(__name__)

CHECK_SECONDS = 5.0  # how soon LIVE made again is noticed (services remake it as often)
INFO_TIMEOUT = 5.0


class LiveListener(Protocol):
    def deliver(self, seq: int, data: bytes) -> None:
        """Take one LIVE message; must not block."""


@runtime_checkable
class RestartListener(Protocol):
    def restarted(self) -> None:
        """LIVE was made again and numbers from 1: the sequences handed out so far name
        nothing now. Must not block. The listener stays joined; what follows is numbered
        anew, from after the stream's end when this is called."""


@runtime_checkable
class ClosingListener(Protocol):
    def closing(self) -> None:
        """This gateway is shutting down: nothing more comes. Must not block."""


@dataclass(eq=False)
class _Channel:
    last_seq: int  # the LIVE sequence handed out last (the stream's end when opened)
    created: str  # LIVE's creation time when opened: another one means LIVE was made again
    listeners: set[LiveListener] = field(default_factory=set)
    sub: Subscription | None = None
    closed: bool = False  # left or opened again: what its subscription still brings is void


class LiveHub:
    def __init__(self, nc: NATS, topology: Topology) -> None:
        self._nc = nc
        self._topology = topology
        self._channels: dict[str, _Channel] = {}
        # One lock per session, held across the NATS requests that open or end its channel:
        # a session whose open is slow (NATS busy, many channels opened again after a
        # restart) must not hold up the joins and leaves of every other session.
        self._turns: Turns[str] = Turns()
        self._watch: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()

    async def join(self, session_id: str, listener: LiveListener) -> int:
        """Start handing the session's LIVE messages to `listener`: every one after the
        returned sequence (earlier ones are the caller's to read from the stream).

        Raises:
            ApiError: 503, this gateway is shutting down (its streams were told so).
        """
        if self._closing.is_set():
            raise _shutting_down()
        async with self._turns.take(session_id):
            if self._closing.is_set():  # while this waited for its turn
                raise _shutting_down()
            channel = self._channels.get(session_id)
            if channel is None:
                channel = await self._open(session_id, set())
                if self._closing.is_set():
                    # `close` told every channel's listeners while this one opened: stored
                    # now, its stream would never hear of the shutdown.
                    await _unsubscribe(channel)
                    raise _shutting_down()
                self._channels[session_id] = channel
            if self._watch is None:
                self._watch = asyncio.create_task(self._watch_live())
            # No await between reading the position and joining: nothing slips in between.
            channel.listeners.add(listener)
            return channel.last_seq

    def generation(self, session_id: str) -> str:
        """Which LIVE the session's channel numbers (a short digest of its creation time),
        for the cursors given out; another one means LIVE was made again in between."""
        channel = self._channels.get(session_id)
        created = channel.created if channel is not None else ""
        return hashlib.sha256(created.encode()).hexdigest()[:8]

    def forget(self, session_id: str, listener: LiveListener) -> None:
        """Hand `listener` nothing more, at once (no wait for the lock); `leave` then ends the
        session's channel if it was the last."""
        channel = self._channels.get(session_id)
        if channel is not None:
            channel.listeners.discard(listener)

    async def leave(self, session_id: str, listener: LiveListener) -> None:
        self.forget(session_id, listener)
        async with self._turns.take(session_id):
            channel = self._channels.get(session_id)
            if channel is None:
                return
            channel.listeners.discard(listener)
            if channel.listeners:
                return
            del self._channels[session_id]
            await _unsubscribe(channel)

    async def close(self) -> None:
        self._closing.set()  # no stream joins from here on
        if self._watch is not None:
            # The flag as well as the cancel: a cancel that lands as a NATS request's answer
            # comes in is lost on Python 3.11 (`wait_for` returns the answer instead), and the
            # loop would go on for ever, this wait with it.
            self._closing.set()
            self._watch.cancel()
            await asyncio.wait({self._watch})
            self._watch = None
        for channel in list(self._channels.values()):
            await _unsubscribe(channel)
            # Told, so their streams end now, saying so, rather than go quiet until the
            # server cuts them without a word.
            for listener in list(channel.listeners):
                if isinstance(listener, ClosingListener):
                    listener.closing()
        self._channels.clear()

    async def _watch_live(self) -> None:
        while not self._closing.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), CHECK_SECONDS)
            if self._closing.is_set():
                return
            try:
                await self._follow_live()
            except Exception as exc:  # NATS away, LIVE not made again yet: the next round
                log.info("live.check_failed", error=repr(exc))

    async def _follow_live(self) -> None:
        """Drop each channel left without listeners, and open again each channel opened on a
        LIVE that is gone (another creation time, or its end before what the channel handed
        out already), telling its listeners."""
        await self._reap()
        # Positions taken before the stream's: a message handed out after the request would
        # be past the end it names without anything being wrong.
        seen = [(session_id, c, c.last_seq) for session_id, c in self._channels.items()]
        if not seen:
            return
        created, end = await self._live_info()
        stale = [(s, c) for s, c, last in seen if c.created != created or end < last]
        for session_id, old in stale:
            async with self._turns.take(session_id):
                await self._reopen(session_id, old)

    async def _reopen(self, session_id: str, old: _Channel) -> None:
        if self._channels.get(session_id) is not old:
            return  # left meanwhile
        if not old.listeners:  # its last listener's `leave` gave up on the lock
            del self._channels[session_id]
            await _unsubscribe(old)
            return
        old.closed = True  # the old numbering's messages must not follow the new's
        try:
            fresh = await self._open(session_id, old.listeners)
        except BaseException:
            old.closed = False  # as it was; the next round tries again
            raise
        self._channels[session_id] = fresh
        await _unsubscribe(old)
        log.warning("live.renumbered", session=session_id, position=fresh.last_seq)
        for listener in list(fresh.listeners):
            if isinstance(listener, RestartListener):
                listener.restarted()

    async def _reap(self) -> None:
        """Channels whose last listener went without leaving (its `leave` gave up on the lock,
        or its feed's cleanup failed before it): each kept a server consumer and took its
        session's chunks for good, nobody reading them."""
        idle = [(s, c) for s, c in self._channels.items() if not c.listeners]
        for session_id, channel in idle:
            async with self._turns.take(session_id):
                if self._channels.get(session_id) is channel and not channel.listeners:
                    del self._channels[session_id]
                    await _unsubscribe(channel)

    async def _live_info(self) -> tuple[str, int]:
        """LIVE's creation time and end."""
        info = await request(
            self._nc, f"{API_PREFIX}.STREAM.INFO.{self._topology.live_stream}", None, INFO_TIMEOUT
        )
        return str(info.get("created", "")), int(info["state"]["last_seq"])

    async def _open(self, session_id: str, listeners: set[LiveListener]) -> _Channel:
        created, end = await self._live_info()
        channel = _Channel(end, created, listeners)

        async def on_message(msg: Msg) -> None:
            if channel.closed:
                return
            seq = msg.metadata.sequence.stream
            if seq <= channel.last_seq:
                # Handed out already: the consumer, made again, replays from where it began.
                # (LIVE made again numbers from 1 anew: the renumbering check reopens the
                # channel, and what the new LIVE held before then is not handed over.)
                return
            channel.last_seq = seq
            for listener in list(channel.listeners):
                listener.deliver(seq, msg.data)

        channel.sub = await ordered_from(
            self._nc, self._topology.live_subject(session_id), end + 1, on_message
        )
        return channel


def _shutting_down() -> ApiError:
    return ApiError(
        503, "this gateway is shutting down; connect again", headers={"Retry-After": "1"}
    )


async def _unsubscribe(channel: _Channel) -> None:
    channel.closed = True
    if channel.sub is not None:
        with contextlib.suppress(Exception):
            await channel.sub.unsubscribe()
