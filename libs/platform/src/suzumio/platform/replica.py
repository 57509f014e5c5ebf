"""A replica of a service that keeps its state in memory, folded from the whole log (the
scheduler, the orchestrator): every replica follows and folds; the one elected leads.

The service brings the two parts that are its own — how it folds a burst of the log (moving
`folded` as it goes) and what it does while leading — and the replica runs them: the follower
from the log's start, the fold loop for as long as it runs, leadership contended on top.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from nats.aio.client import Client as NATS

from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.follower import LogFollower
from suzumio.platform.db.leadership import Lead, Leadership
from suzumio.platform.position import Position

FoldLoop = Callable[[asyncio.Event], Coroutine[Any, Any, None]]


class Replica:
    def __init__(self, nc: NATS, topology: Topology, database_url: str, role: str) -> None:
        self.follower = LogFollower(nc, topology)
        self.folded = Position()
        self.leadership = Leadership(database_url, f"{role}.{topology.namespace or '-'}")
        self._started = False

    @property
    def caught_up(self) -> bool:
        """Everything the log held when following began is folded: ready to serve."""
        return self._started and self.folded.value >= self.follower.replay_end

    async def run(self, stop: asyncio.Event, fold_loop: FoldLoop, lead: Lead) -> None:
        """Follow, fold and contend until `stop`; if the fold loop fails, stop contending (a
        leader whose state no longer moves would hold the lock while deciding nothing, and
        no standby could take over) and raise its error, so the service restarts."""
        await self.follower.start()
        self._started = True
        folding = asyncio.create_task(fold_loop(stop))
        ended = asyncio.Event()  # `stop`, or the fold loop over
        stopping = asyncio.create_task(stop.wait())
        for task in (folding, stopping):
            task.add_done_callback(lambda _: ended.set())
        try:
            await self.leadership.run(ended, lead)
        finally:
            stopping.cancel()
            folding.cancel()
            await asyncio.wait({folding})
            await self.follower.close()
        if not folding.cancelled() and (error := folding.exception()) is not None:
            raise error
