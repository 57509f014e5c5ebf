"""Figures of the event log: appends, projector throughput, rebuild time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS

from suzumio.contracts.events import ProjectCreated, ProjectRenamed
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus import connection
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.bus.jsapi import ensure_streams, stream_last_seq
from suzumio.platform.db import pool as db
from suzumio.platform.db.migrations import apply_migrations, platform_migrations
from suzumio.platform.db.pool import Pool
from suzumio.platform.projections import load_projections
from suzumio.platform.projections.rebuild import rebuild
from suzumio.testing import servers
from tests.integration.projector_support import caught_up, running_projector
from tests.scenario import Scenario, write

APPENDS = 40_000
IN_FLIGHT = 128
PROJECTOR_EVENTS = 50_000
REBUILD_EVENTS = 100_000


@dataclass
class Env:
    nc: NATS
    store: EventStore
    topology: Topology
    dsn: str
    pool: Pool


@asynccontextmanager
async def environment(nats_url: str, pg_url: str) -> AsyncIterator[Env]:
    topology = servers.fresh_topology()
    nc = await connection.connect(nats_url, "bench")
    await ensure_streams(nc, topology.streams())
    dsn = await servers.create_database(pg_url)
    pool = await db.create_pool(dsn, "bench", max_size=4)
    await apply_migrations(pool, platform_migrations())
    try:
        yield Env(nc, EventStore(nc, topology), topology, dsn, pool)
    finally:
        await pool.close()
        await nc.close()
        await servers.drop_database(pg_url, dsn)


async def _pipelined(count: int, make: Any) -> float:
    slots = asyncio.Semaphore(IN_FLIGHT)

    async def one(i: int) -> None:
        async with slots:
            await make(i)

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(count)))
    return count / (time.perf_counter() - started)


async def appends(nats_url: str, pg_url: str, _: Path) -> dict[str, Any]:
    """Conditional appends from one process across many aggregates, `IN_FLIGHT` pipelined."""
    async with environment(nats_url, pg_url) as env:
        ids = [new_id() for _ in range(APPENDS)]
        created = ProjectCreated(name="bench", owner_id="u")
        new_rate = await _pipelined(APPENDS, lambda i: env.store.append(ids[i], [created], 0))
        renamed = ProjectRenamed(name="renamed")
        # Every aggregate now exists: each append names version 1 and is checked against it.
        existing_rate = await _pipelined(APPENDS, lambda i: env.store.append(ids[i], [renamed], 1))
        fresh = EventStore(env.nc, env.topology)  # knows nothing: looks each head up first
        cold_rate = await _pipelined(APPENDS // 4, lambda i: fresh.append(ids[i], [renamed], 2))
    return {
        "conditional_appends_per_s_new_aggregates": round(new_rate),
        "conditional_appends_per_s_existing_aggregates": round(existing_rate),
        "conditional_appends_per_s_cold_cache": round(cold_rate),
        "in_flight": IN_FLIGHT,
        "aggregates": APPENDS,
        "target_per_s": 8_000,
    }


async def projector(nats_url: str, pg_url: str, _: Path) -> dict[str, Any]:
    """The live projector (all projections of the session service) working off a backlog."""
    projections = load_projections()
    async with environment(nats_url, pg_url) as env:
        async with running_projector(env.nc, env.dsn, env.topology, env.store, projections):
            await caught_up(env.nc, env.pool, env.topology, projections)  # empty tables built
        events = await write(env.store, Scenario(seed=1).take_events(PROJECTOR_EVENTS))
        started = time.perf_counter()
        async with running_projector(
            env.nc, env.dsn, env.topology, env.store, projections, batch=1_000
        ):
            await caught_up(env.nc, env.pool, env.topology, projections, timeout=600)
        seconds = time.perf_counter() - started
    return {
        "events": events,
        "projections": [p.name for p in projections],
        "seconds": round(seconds, 2),
        "events_per_s": round(events / seconds),
        "target_events_per_s": 5_000,
    }


async def rebuild_100k(nats_url: str, pg_url: str, _: Path) -> dict[str, Any]:
    """`suzumio projections rebuild` of every projection over a log of 100,000 events."""
    projections = load_projections()
    async with environment(nats_url, pg_url) as env:
        events = await write(env.store, Scenario(seed=2).take_events(REBUILD_EVENTS))
        messages = await stream_last_seq(env.nc, env.topology.events_stream)
        started = time.perf_counter()
        results = await rebuild(env.nc, env.dsn, env.topology, projections)
        seconds = time.perf_counter() - started
    return {
        "events": events,
        "log_messages": messages,
        "projections": [r.projection for r in results],
        "seconds": round(seconds, 2),
        "events_per_s": round(events / seconds),
        "target_seconds": 30,
    }
