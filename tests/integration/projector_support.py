"""Running a projector in the test process and waiting for it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from nats.aio.client import Client as NATS
from nats.js.api import PubAck

from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.eventstore import HDR_MSG_ID, HDR_TYPE, HDR_VERSION, EventStore
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


async def publish_newer_schema_event(nc: NATS, topology: Topology) -> PubAck:
    """A tool call's start as a newer release would write it (schema 99), which the
    `tool_calls` projection reads and this code cannot decode."""
    activation_id = new_id()
    envelope = {
        "id": new_id(), "type": "activation.tool_call_started", "aggregate": "activation",
        "aggregate_id": activation_id, "version": 1, "occurred_at": "2030-01-01T00:00:00Z",
        "actor": "system:future", "correlation_id": "c", "schema": 99, "data": {"call_id": "c1"},
    }  # fmt: skip
    return await nc.jetstream().publish(
        topology.event_subject("activation", activation_id),
        json.dumps(envelope).encode(),
        headers={HDR_MSG_ID: envelope["id"], HDR_TYPE: envelope["type"], HDR_VERSION: "1"},
    )
