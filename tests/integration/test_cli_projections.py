"""`suzumio projections rebuild|status` as a user runs them, against real servers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from nats.aio.client import Client as NATS

from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.db.pool import Pool
from suzumio.platform.projections import load_projections
from suzumio.platform.projections.checkpoints import read_all
from suzumio.platform.projections.verify import verify
from tests.integration.projector_support import (
    caught_up,
    publish_newer_schema_event,
    running_projector,
)
from tests.scenario import Scenario, write


async def suzumio(
    nats_url: str, database_url: str, topology: Topology, *args: str
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SUZUMIO_NATS_URL": nats_url, "SUZUMIO_DATABASE_URL": database_url,
           "SUZUMIO_NAMESPACE": topology.namespace, "COLUMNS": "200"}  # fmt: skip
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "suzumio.cli", *args],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


async def test_rebuild_and_status_commands(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, nats_url: str, topology: Topology
) -> None:
    projections = load_projections()
    async with running_projector(nc, database_url, topology, store, projections):
        await write(store, Scenario(seed=21).appends(200))
        last = await caught_up(nc, pool, topology, projections)
        before = await read_all(pool)

        done = await suzumio(nats_url, database_url, topology, "projections", "rebuild")
        assert done.returncode == 0, done.stderr
        for p in projections:
            assert f"{p.name}: rebuilt to position {last}" in done.stdout

        status = await suzumio(nats_url, database_url, topology, "projections", "status")
        assert status.returncode == 0, status.stderr
        assert f"log position: {last}" in status.stdout

    after = await read_all(pool)
    assert all(after[p.name].rebuilt_at != before[p.name].rebuilt_at for p in projections)
    assert all(r.equal for r in await verify(nc, database_url, topology, projections))


async def test_unknown_projection_is_a_clear_error(
    nats_url: str, database_url: str, topology: Topology
) -> None:
    done = await suzumio(nats_url, database_url, topology, "projections", "rebuild", "nope")
    assert done.returncode == 2
    assert "unknown projection(s): nope" in done.stderr
    assert "sessions" in done.stderr  # the known ones are listed


async def test_rebuild_says_which_projection_is_held_for_a_newer_release(
    nc: NATS, store: EventStore, database_url: str, nats_url: str, topology: Topology
) -> None:
    held = await publish_newer_schema_event(nc, topology)
    done = await suzumio(
        nats_url, database_url, topology, "projections", "rebuild", "tool_calls", "projects"
    )
    assert done.returncode == 0, done.stderr
    assert f"tool_calls: rebuilt to position {held.seq - 1}" in done.stdout
    assert f"held before seq {held.seq}: its event needs a newer release" in done.stdout
    projects = next(line for line in done.stdout.splitlines() if line.startswith("projects:"))
    assert "held" not in projects
