"""A last word about a dispatch from a worker other than the one running it: a worker that
held the dispatch before (cut off from NATS past the ack wait while it brought the files in)
comes back and finds the dispatch claimed by the worker the queue gave it to since, or its
files failed. Its `refused` or `exited` was taken for the run's end, and the healthy run on
the other worker was cancelled and retried."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS

from suzumio.contracts.runner import PoolStatus
from suzumio.contracts.subjects import Topology
from suzumio.orchestrator.backends.base import Handle
from suzumio.orchestrator.backends.pool import PoolBackend
from tests.integration.test_pool_backend import (  # noqa: F401 - fixtures
    SETTINGS,
    backend,
    closed_port_url,
    make_plan,
)


async def _say(
    nc: NATS, topology: Topology, handle: Handle, worker: str, kind: str, **extra: Any
) -> None:
    status = PoolStatus.model_validate(
        {
            "kind": kind,
            "dispatch_id": handle.sandbox_id,
            "activation_id": handle.activation_id,
            "attempt": 1,
            "worker_id": worker,
            "pool": "default",
            "at": datetime.now(UTC),
            **extra,
        }
    )
    await nc.publish(
        topology.pool_status_subject(handle.activation_id), status.model_dump_json().encode()
    )
    await nc.flush()


async def test_a_stale_workers_last_word_does_not_end_a_run_on_another_worker(
    backend: PoolBackend,  # noqa: F811
    nc: NATS,
    topology: Topology,
    tmp_path: Path,
) -> None:
    handle = await backend.launch(make_plan(closed_port_url(), tmp_path))
    watching = asyncio.create_task(backend.watch(handle))
    try:
        await _say(nc, topology, handle, "b", "started")
        await _say(nc, topology, handle, "a", "exited", reason="spawn_failed", detail="no files")
        await _say(nc, topology, handle, "a", "refused", reason="claimed")
        await asyncio.sleep(0.5)  # within the heartbeat timeout: b's run goes on
        assert not watching.done(), watching.result()
        await _say(nc, topology, handle, "b", "exited", reason="exited", exit_code=0)
        ended = await asyncio.wait_for(watching, 10)
    finally:
        watching.cancel()
    assert (ended.code, ended.reason) == (0, "exited")


async def test_after_a_takeover_a_stale_workers_last_word_does_not_end_the_run(
    backend: PoolBackend,  # noqa: F811
    nc: NATS,
    topology: Topology,
    tmp_path: Path,
) -> None:
    """An orchestrator that took over watches what the workers listed as running, on the
    worker that listed it: before that worker's next word, another's stale one was taken."""
    launched = await backend.launch(make_plan(closed_port_url(), tmp_path))
    successor = PoolBackend(nc, topology, SETTINGS)
    try:
        listed = Handle(  # as `list_live` finds it, running on b
            launched.activation_id,
            "pool",
            launched.sandbox_id,
            {"pool": "default", "attempt": 1, "state": "running", "worker_id": "b"},
        )
        watching = asyncio.create_task(successor.watch(listed))
        try:
            await asyncio.sleep(0.1)  # it listens
            await _say(nc, topology, listed, "a", "refused", reason="claimed")
            await asyncio.sleep(0.5)  # within the heartbeat timeout: b's run goes on
            assert not watching.done(), watching.result()
            await _say(nc, topology, listed, "b", "exited", reason="exited", exit_code=0)
            ended = await asyncio.wait_for(watching, 10)
        finally:
            watching.cancel()
    finally:
        await successor.close()
    assert (ended.code, ended.reason) == (0, "exited")
