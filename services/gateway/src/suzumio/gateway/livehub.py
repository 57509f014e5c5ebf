"""One LIVE subscription per watched session per gateway, shared by every stream of it.

A session watched by a hundred browsers costs one ordered consumer, not a hundred: each
message is received, sequenced and handed to every listener once. A listener that cannot keep
up is told so (and its stream ends, to be resumed from its cursor) instead of slowing the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Protocol

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import ConsumerConfig, DeliverPolicy

from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.jsapi import stream_last_seq


class LiveListener(Protocol):
    def deliver(self, seq: int, data: bytes) -> None:
        """Take one LIVE message; must not block."""


@dataclass(eq=False)
class _Channel:
    last_seq: int  # the LIVE sequence handed out last (the stream's end when opened)
    listeners: set[LiveListener] = field(default_factory=set)
    sub: Subscription | None = None


class LiveHub:
    def __init__(self, nc: NATS, topology: Topology) -> None:
        self._nc = nc
        self._topology = topology
        self._channels: dict[str, _Channel] = {}
        self._lock = asyncio.Lock()  # joins and leaves are rare next to messages

    async def join(self, session_id: str, listener: LiveListener) -> int:
        """Start handing the session's LIVE messages to `listener`: every one after the
        returned sequence (earlier ones are the caller's to read from the stream)."""
        async with self._lock:
            channel = self._channels.get(session_id)
            if channel is None:
                channel = await self._open(session_id)
                self._channels[session_id] = channel
            # No await between reading the position and joining: nothing slips in between.
            channel.listeners.add(listener)
            return channel.last_seq

    async def leave(self, session_id: str, listener: LiveListener) -> None:
        async with self._lock:
            channel = self._channels.get(session_id)
            if channel is None:
                return
            channel.listeners.discard(listener)
            if channel.listeners:
                return
            del self._channels[session_id]
            if channel.sub is not None:
                with contextlib.suppress(Exception):
                    await channel.sub.unsubscribe()

    async def close(self) -> None:
        for channel in list(self._channels.values()):
            if channel.sub is not None:
                with contextlib.suppress(Exception):
                    await channel.sub.unsubscribe()
        self._channels.clear()

    async def _open(self, session_id: str) -> _Channel:
        end = await stream_last_seq(self._nc, self._topology.live_stream)
        channel = _Channel(end)

        async def on_message(msg: Msg) -> None:
            seq = msg.metadata.sequence.stream
            channel.last_seq = seq
            for listener in list(channel.listeners):
                listener.deliver(seq, msg.data)

        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=end + 1
        )
        channel.sub = await self._nc.jetstream().subscribe(
            self._topology.live_subject(session_id),
            ordered_consumer=True,
            config=config,
            cb=on_message,
        )
        return channel
