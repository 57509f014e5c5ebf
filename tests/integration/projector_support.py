"""Running a projector in the test process and waiting for it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from nats.aio.client import Client as NATS

from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.bus.jsapi import stream_last_seq
from suzumio.platform.db.pool import Pool
from suzumio.platform.projections.base import Projection
from suzumio.platform.projections.checkpoints import Checkpoint, read_all
from suzumio.platform.projections.projector import Projector
from tests.support import eventually


@asynccontextmanager
async def running_projector(
    nc: NATS,
    dsn: str,
    topology: Topology,
    store: EventStore,
    projections: Sequence[Projection],
    *,
    batch: int = 500,
) -> AsyncIterator[Projector]:
    projector = Projector(nc, dsn, topology, projections, store, batch=batch)
    stop = asyncio.Event()
    task = asyncio.create_task(projector.run(stop))
    try:
        yield projector
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def caught_up(
    nc: NATS, pool: Pool, topology: Topology, projections: Sequence[Projection], timeout: float = 30
) -> int:
    """Wait until every projection's checkpoint is the log's last sequence; returns it."""

    async def probe() -> tuple[int, dict[str, Checkpoint]]:
        return await stream_last_seq(nc, topology.events_stream), await read_all(pool)

    def done(state: tuple[int, dict[str, Checkpoint]]) -> bool:
        last, rows = state
        return all(
            p.name in rows and rows[p.name].position == last and rows[p.name].version == p.version
            for p in projections
        )

    last, _ = await eventually(probe, done, timeout=timeout, what="checkpoints at the log's end")
    return last
