"""SIGKILL the projector at random points while it works through 20,000 events: after a
restart the projections must equal a rebuild from zero, with every checkpoint at the end of
the log. (The projector runs inside the session service process, as in production.)"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import AsyncIterator
from pathlib import Path

from nats.aio.client import Client as NATS

from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.bus.jsapi import stream_last_seq
from suzumio.platform.db.pool import Pool
from suzumio.platform.projections import load_projections
from suzumio.platform.projections.checkpoints import read_all
from suzumio.platform.projections.verify import verify
from suzumio.testing.processes import ServiceProcess
from tests.integration.projector_support import caught_up
from tests.scenario import Append, Scenario, write
from tests.support import eventually

EVENTS = 20_000
KILLS = 8


async def test_projections_survive_sigkill_and_equal_a_rebuild(
    nc: NATS,
    store: EventStore,
    pool: Pool,
    database_url: str,
    nats_url: str,
    topology: Topology,
    tmp_path: Path,
) -> None:
    seed = int(os.environ.get("SUZUMIO_FAULT_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    scenario = Scenario(seed=seed)
    # The backlog the projector works through while it is killed, plus a trickle of new events
    # arriving all along.
    written = await write(store, scenario.take_events(EVENTS))
    # The trickle goes on until the last kill (however slowly the service starts on a busy
    # machine), so every kill can land while there is work in flight.
    killing = asyncio.Event()
    trickle = slowly(scenario.take_events(EVENTS // 2), until=killing)
    writer = asyncio.create_task(write(store, trickle))
    projections = load_projections()
    env = {"SUZUMIO_PROJECTOR_BATCH": "10"}  # many small transactions: more to interrupt
    log_path = tmp_path / "session.log"

    def service() -> ServiceProcess:
        return ServiceProcess("session", nats_url, database_url, topology, log_path, env)

    killed_at: list[int] = []
    for _ in range(KILLS):
        proc = service().start()
        before = await positions(pool)
        await eventually(  # it started working (or had nothing left to do)
            lambda: progress(nc, pool, topology),
            lambda now, b=before: bool(now[0]) and (now[0] != b or now[1]),  # type: ignore[misc]
            timeout=60,
            what=f"progress (seed {seed})",
        )
        await asyncio.sleep(rng.uniform(0.0, 0.25))
        proc.kill()
        killed_at.append(min((await positions(pool)).values()))

    killing.set()
    written += await writer
    last = await stream_last_seq(nc, topology.events_stream)
    assert written >= EVENTS
    final = service().start()
    try:
        await final.wait_ready()
        await caught_up(nc, pool, topology, projections, timeout=120)
        code, _ = await final.terminate()
    finally:
        if final.process and final.process.poll() is None:
            final.kill()

    assert code == 0
    assert sum(1 for p in killed_at if p < last) >= KILLS // 2, (killed_at, last, seed)
    rows = await read_all(pool)
    assert {name: cp.position for name, cp in rows.items()} == {p.name: last for p in projections}
    for result in await verify(nc, database_url, topology, projections):
        assert result.position == last
        assert result.equal, (result, seed)


async def progress(nc: NATS, pool: Pool, topology: Topology) -> tuple[dict[str, int], bool]:
    """The checkpoints, and whether they all stand at the end of the log."""
    now = await positions(pool)
    end = await stream_last_seq(nc, topology.events_stream)
    return now, bool(now) and all(p == end for p in now.values())


async def slowly(appends: list[Append], until: asyncio.Event) -> AsyncIterator[Append]:
    for append in appends:
        if until.is_set():
            return
        await asyncio.sleep(0.005)
        yield append


async def positions(pool: Pool) -> dict[str, int]:
    return {name: cp.position for name, cp in (await read_all(pool)).items()}
