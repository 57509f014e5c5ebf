"""Following the event log in order, as soon as each message is stored.

For services that keep their working state in memory and rebuild it from the log on start
(the scheduler, the orchestrator): an ordered push consumer over the whole log, from a given
sequence, with flow control. It knows the log's end when it started, so the follower can tell
when the replay is over and live following begins.

A reader slower than the log is held back by the follower's queue, but not the server:
nats-py answers flow control as messages arrive, not as the callback takes them, so the
server keeps pushing and the subscription drops what overflows it (a "slow consumer") after
the ordered consumer has already counted it as seen, so it is never asked for again. The
follower therefore checks the sequences itself (the log's are contiguous: EVENTS denies
deletes, and the follower reads all of it): a message after a gap, or a log that ends past
the last message while nothing comes, makes it read what is missing by Direct Get, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from datetime import UTC, datetime

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.direct_get import StoredMessage, first_since, iter_subject
from suzumio.platform.bus.eventstore import types_of, version_in
from suzumio.platform.bus.jsapi import stream_last_seq
from suzumio.platform.bus.ordered import ordered_from
from suzumio.platform.logging import get_logger

log = get_logger(__name__)

QUEUE_BYTES = 64 * 1024 * 1024  # what a follower holds for its reader, about


@dataclass(frozen=True, slots=True)
class LogMessage:
    seq: int
    subject: str
    types: tuple[str, ...]
    version: int  # the aggregate's version after this message (0 if it has none)
    data: bytes
    pending: int  # messages after this one in the log when it was delivered
    stored_at: datetime  # the server's clock when it stored the message


class LogFollower:
    def __init__(
        self,
        nc: NATS,
        topology: Topology,
        *,
        start_seq: int = 1,
        start_time: datetime | None = None,
        queue_size: int = 10_000,
        queue_bytes: int = QUEUE_BYTES,
        check_every: float = 2.0,
    ) -> None:
        """From `start_seq`, or from the first message stored at or after `start_time` (for
        followers that only care about recent facts, such as live activations)."""
        self._nc = nc
        self._topology = topology
        self._start = max(start_seq, 1)
        self._start_time = start_time
        self._queue: asyncio.Queue[LogMessage] = asyncio.Queue(queue_size)
        # The queue is bounded in bytes too: 10,000 messages of a few megabytes each (history
        # a sandbox wrote) would be gigabytes held for a slow reader.
        self._queue_bytes = queue_bytes
        self._queued_bytes = 0
        self._taken = asyncio.Event()  # a message left the queue: room, maybe
        self._sub: Subscription | None = None
        self.replay_end = 0  # the log's last sequence when following began
        self._last = 0  # the last sequence put in the queue
        self._order = asyncio.Lock()  # pushed messages and gap reads queue one at a time
        self._arrived = 0.0  # loop time of the last pushed message
        self._check_every = check_every
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Begin following; returns the log's end at this moment (0 for an empty log)."""
        self.replay_end = await stream_last_seq(self._nc, self._topology.events_stream)

        loop = asyncio.get_running_loop()

        async def on_message(msg: Msg) -> None:
            meta = msg.metadata
            seq = meta.sequence.stream
            async with self._order:
                if seq <= self._last:
                    return  # read already, by a gap read
                if seq > self._last + 1:
                    log.warning("follower.gap", after=self._last, seq=seq)
                    await self._read_missing(seq - 1)
                    if seq <= self._last:
                        return
                    if self._last < seq - 1:
                        # The read ended short of the gap (answered by a replica behind the
                        # rest): queued now, this one would leave the missing ones out for
                        # good. The next message, or the tail check, reads on from there.
                        log.warning("follower.gap_unread", after=self._last, seq=seq)
                        return
                types = types_of(msg.headers)
                await self._put(
                    LogMessage(
                        seq,
                        msg.subject,
                        tuple(types or ()),
                        version_in(msg.headers, msg.data),
                        msg.data,
                        meta.num_pending,
                        meta.timestamp,
                    )
                )
                self._last = seq
                # Only when the follower moves on: messages it had (an ordered consumer's
                # replay after a reset) must not keep the tail check from reading the new.
                self._arrived = loop.time()

        start = self._start
        if self._start_time is not None:
            # Resolved to a sequence here, never left to the consumer as a start time: the
            # ordered consumer recreates itself after a gap or a lost heartbeat (a NATS restart)
            # by start sequence, keeping the rest of its first config, and the server refuses a
            # start sequence beside a start time (10094) — the follower would go silent.
            first = await first_since(self._nc, self._topology.events_stream, self._start_time)
            start = first.seq if first is not None else self.replay_end + 1
        self._last = start - 1
        self._arrived = loop.time()
        self._sub = await ordered_from(self._nc, self._topology.events_filter(), start, on_message)
        self._watch = asyncio.create_task(self._watch_tail())
        return self.replay_end

    async def _read_missing(self, through: int) -> None:
        """Queue, in order, the log's messages after the last one queued up to `through` (at
        least), read by Direct Get. Called holding `_order`."""
        async for stored in iter_subject(
            self._nc,
            self._topology.events_stream,
            self._topology.events_filter(),
            after_seq=self._last,
            min_last_seq=through,  # from a replica that holds them (a cluster's may lag)
        ):
            if stored.seq <= self._last:
                continue
            await self._put(_from_stored(stored, max(through - stored.seq, 0)))
            self._last = stored.seq
            if stored.seq >= through:
                return

    async def _watch_tail(self) -> None:
        """Notice messages dropped at the end of the log, which no later message reveals."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._check_every)
            if loop.time() - self._arrived < self._check_every or self._full():
                continue  # messages are coming, or the reader has plenty to do
            try:
                last = await stream_last_seq(self._nc, self._topology.events_stream)
                if last > self._last:
                    async with self._order:
                        if last > self._last:
                            await self._read_missing(last)
            except Exception as exc:  # NATS away: the next round asks again
                log.warning("follower.check_failed", error=repr(exc))

    async def _put(self, message: LogMessage) -> None:
        """Queue `message`, waiting while the queue holds its bytes' worth (one message, of
        whatever size, always goes in: the reader needs it to go on)."""
        size = len(message.data)
        while self._queued_bytes and self._queued_bytes + size > self._queue_bytes:
            self._taken.clear()
            await self._taken.wait()
        self._queued_bytes += size
        await self._queue.put(message)

    def _full(self) -> bool:
        return self._queue.full() or self._queued_bytes >= self._queue_bytes

    def _took(self, message: LogMessage) -> LogMessage:
        self._queued_bytes -= len(message.data)
        self._taken.set()
        return message

    async def next(self, timeout: float | None = None) -> LogMessage | None:
        """The next message; None when none came within `timeout` seconds."""
        try:
            return self._took(await asyncio.wait_for(self._queue.get(), timeout))
        except TimeoutError:
            return None

    def next_nowait(self) -> LogMessage | None:
        try:
            return self._took(self._queue.get_nowait())
        except asyncio.QueueEmpty:
            return None

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(BaseException):
                await self._watch
            self._watch = None
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None


def _from_stored(stored: StoredMessage, pending: int) -> LogMessage:
    headers = stored.headers
    stamp = headers.get("Nats-Time-Stamp", "")
    try:  # RFC 3339 with nanoseconds: datetime takes microseconds
        head, _, frac = stamp.rstrip("Z").partition(".")
        stored_at = datetime.fromisoformat(head + "." + (frac + "000000")[:6]).replace(tzinfo=UTC)
    except ValueError:
        stored_at = datetime.now(UTC)
    return LogMessage(
        stored.seq,
        stored.subject,
        tuple(types_of(headers) or ()),
        version_in(headers, stored.data),
        stored.data,
        pending,
        stored_at,
    )
