"""Following the event log in order, as soon as each message is stored.

For services that keep their working state in memory and rebuild it from the log on start
(the scheduler, the orchestrator): an ordered push consumer over the whole log, from a given
sequence, with flow control. It knows the log's end when it started, so the follower can tell
when the replay is over and live following begins.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from datetime import datetime

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import ConsumerConfig, DeliverPolicy

from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.direct_get import first_since
from suzumio.platform.bus.eventstore import HDR_VERSION, types_of
from suzumio.platform.bus.jsapi import stream_last_seq


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
    ) -> None:
        """From `start_seq`, or from the first message stored at or after `start_time` (for
        followers that only care about recent facts, such as live activations)."""
        self._nc = nc
        self._topology = topology
        self._start = max(start_seq, 1)
        self._start_time = start_time
        self._queue: asyncio.Queue[LogMessage] = asyncio.Queue(queue_size)
        self._sub: Subscription | None = None
        self.replay_end = 0  # the log's last sequence when following began

    async def start(self) -> int:
        """Begin following; returns the log's end at this moment (0 for an empty log)."""
        self.replay_end = await stream_last_seq(self._nc, self._topology.events_stream)

        async def on_message(msg: Msg) -> None:
            meta = msg.metadata
            types = types_of(msg.headers)
            await self._queue.put(
                LogMessage(
                    meta.sequence.stream,
                    msg.subject,
                    tuple(types or ()),
                    int((msg.headers or {}).get(HDR_VERSION, 0)),
                    msg.data,
                    meta.num_pending,
                    meta.timestamp,
                )
            )

        start = self._start
        if self._start_time is not None:
            # Resolved to a sequence here, never left to the consumer as a start time: the
            # ordered consumer recreates itself after a gap or a lost heartbeat (a NATS restart)
            # by start sequence, keeping the rest of its first config, and the server refuses a
            # start sequence beside a start time (10094) — the follower would go silent.
            first = await first_since(self._nc, self._topology.events_stream, self._start_time)
            start = first.seq if first is not None else self.replay_end + 1
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start)
        self._sub = await self._nc.jetstream().subscribe(
            self._topology.events_filter(),
            ordered_consumer=True,
            config=config,
            cb=on_message,
        )
        return self.replay_end

    async def next(self, timeout: float | None = None) -> LogMessage | None:
        """The next message; None when none came within `timeout` seconds."""
        try:
            return await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return None

    def next_nowait(self) -> LogMessage | None:
        try:
            return self._queue.get_nowait()
        except asyncio.QueueEmpty:
            return None

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
