"""A pool worker whose pool consumer is deleted under it (by an operator, or its stream made
again) makes it again and pulls on: every pull failed, once a second, for as long as the
worker lived, and the pool's dispatches waited for an orchestrator's restart. Real NATS, an
in-process worker, a real runner."""

from __future__ import annotations

from pathlib import Path

from nats.aio.client import Client as NATS

from suzumio.contracts.subjects import Topology
from suzumio.orchestrator.backends.pool import PoolBackend
from tests.integration.test_pool_backend import (  # noqa: F401 - fixtures
    backend,
    fenced_url,
    make_plan,
    wait_workers,
    watch,
)
from tests.integration.test_pool_limits import in_process_worker


async def test_a_deleted_pool_consumer_is_made_again_by_the_worker(
    backend: PoolBackend,  # noqa: F811
    nc: NATS,
    nats_url: str,
    topology: Topology,
    fenced_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with in_process_worker(nats_url, topology.namespace, tmp_path / "w", worker_id="wa"):
        await wait_workers(backend, "wa")
        first = await backend.launch(make_plan(fenced_url, tmp_path))
        assert (await watch(backend, first)).code == 6  # its runner ran, and was refused
        await nc.jetstream().delete_consumer(
            topology.activations_stream, topology.pool_consumer("default")
        )

        handle = await backend.launch(make_plan(fenced_url, tmp_path))

        result = await watch(backend, handle, timeout=60)
        assert (result.code, result.reason) == (6, "exited")
