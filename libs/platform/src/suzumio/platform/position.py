"""How far something has come along the event log, and waiting until it reached a sequence.

The services that fold the log in memory (scheduler, orchestrator, the tool-broker's registry)
and the gateway's read-your-writes watcher all answer the same question — "have you seen
everything up to sequence N?" — before they act: a leader before it leads, the broker before
it trusts its fencing, an API read before it answers. One `Position` per follower: it moves
the position as it folds and says so once per burst; readers wait with `reached`.
"""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NATS

from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.jsapi import stream_last_seq


class Position:
    def __init__(self) -> None:
        self.value = 0
        self._changed = asyncio.Condition()

    async def advance(self, value: int) -> None:
        """Set it (after folding up to `value`) and wake whoever waits."""
        self.value = value
        async with self._changed:
            self._changed.notify_all()

    async def reached(self, position: int, timeout: float | None) -> bool:
        """True once `value` is at `position` or beyond; False after `timeout` seconds."""
        if self.value >= position:
            return True
        try:
            async with asyncio.timeout(timeout), self._changed:
                await self._changed.wait_for(lambda: self.value >= position)
        except TimeoutError:
            return False
        return True

    async def caught_up(
        self, nc: NATS, topology: Topology, done: asyncio.Event, step: float = 5.0
    ) -> bool:
        """Wait until everything stored in the log by now is folded (a new leader's first
        duty); False if `done` was set first."""
        end = await stream_last_seq(nc, topology.events_stream)
        while not await self.reached(end, step):
            if done.is_set():
                return False
        return True
