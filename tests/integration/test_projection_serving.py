"""Which projections serve (their checkpoints count for read-your-writes waits), as marked
when a projector begins to lead.

Marked with a JSON object the connections' jsonb codec encoded a second time, every projection
stopped serving at each projector's start after the first (a restart of the platform): every
write's wait for the read models then ran out, a 504. And the rows are locked in name order by
every locker: marking beside a rebuild's swap holding some of them waits, not deadlocks —
Postgres aborted one of the two, which could be the swap, after its whole replay of the log."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import cast

from nats.aio.client import Client as NATS

from suzumio.contracts.events import ProjectCreated
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.bus.jsapi import stream_last_seq
from suzumio.platform.db import pool as db
from suzumio.platform.db.pool import Pool
from suzumio.platform.projections import checkpoints
from suzumio.platform.projections.base import Projection
from suzumio.platform.projections.positions import PositionWatcher
from suzumio.session.projections.projects import ProjectsProjection
from tests.integration.projector_support import caught_up, running_projector


def _named(name: str) -> Projection:
    """What marking reads of a projection: its name and version."""
    return cast("Projection", SimpleNamespace(name=name, version=1))


async def test_marking_which_projections_serve_waits_for_a_swap_without_deadlock(
    pool: Pool, database_url: str
) -> None:
    names = ["zeta", "alpha"]  # stored in this order: an UPDATE finds zeta first
    for name in names:
        await pool.execute(
            "INSERT INTO suzumio.projection_checkpoints (name, position, version, schema_name,"
            " serving) VALUES ($1, 0, 1, $2, false)",
            name,
            f"proj_{name}",
        )
    # Connections as the projector and the rebuild make them.
    swap = await db.connect(database_url, "suzumio-test-swap")
    projector = await db.connect(database_url, "suzumio-test-projector")
    try:
        swapping = swap.transaction()
        await swapping.start()
        await checkpoints.lock_rows(swap, ["alpha"])  # the swap's first, by name
        marking = asyncio.create_task(
            checkpoints.mark_serving(projector, [_named(n) for n in names])
        )
        await asyncio.sleep(0.3)  # the projector waits on alpha (holding zeta, before)
        await checkpoints.lock_rows(swap, ["alpha", "zeta"])  # the swap goes on
        await swapping.commit()
        await asyncio.wait_for(marking, 10)
    finally:
        await swap.close()
        await projector.close()
    serving = await pool.fetch(
        "SELECT name FROM suzumio.projection_checkpoints WHERE serving ORDER BY name"
    )
    assert [r["name"] for r in serving] == ["alpha", "zeta"]


async def test_a_projector_leading_again_keeps_its_projections_serving(
    nc: NATS, store: EventStore, topology: Topology, pool: Pool, database_url: str
) -> None:
    projections = [ProjectsProjection()]
    for _ in range(2):  # the platform started, stopped, and started again
        async with running_projector(nc, database_url, topology, store, projections):
            await store.append(new_id(), [ProjectCreated(name="p", owner_id="u")], 0)
            await caught_up(nc, pool, topology, projections)
            watcher = PositionWatcher(database_url)
            stop = asyncio.Event()
            watching = asyncio.create_task(watcher.run(stop))
            try:
                last = await stream_last_seq(nc, topology.events_stream)
                assert await watcher.wait_for(last, 10, projection="projects")
            finally:
                stop.set()
                await asyncio.wait_for(watching, 10)
