"""The backend behaviour suite (tests/backend_suite.py) on the pool backend: a real worker
process (`python -m suzumio.runner worker`) pulls the dispatches from the ACTIVATIONS work
queue and runs each runner as a process sandbox of its own — with warm sessions, so each
activation runs on its session's resident runner (tests/integration/test_pool_backend.py covers
runners forked per activation, and a resident runner kept for a session's next ones)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from suzumio.orchestrator.backends.base import Backend
from suzumio.orchestrator.backends.pool import PoolBackend, PoolSettings
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.testing.model_server import ScriptedModelServer
from tests.backend_suite import SCENARIOS, Harness, harness
from tests.e2e.stack import Stack
from tests.support import start_pool_worker


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.send_signal(signal.SIGTERM)
    for proc in started:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
async def test_pool_backend(
    platform: Stack,
    model: ScriptedModelServer,
    tmp_path: Path,
    workers: list[subprocess.Popen[bytes]],
    scenario: Callable[[Harness], Awaitable[None]],
) -> None:
    async def pool_backend(settings: OrchestratorSettings) -> Backend:
        del settings
        workers.append(
            start_pool_worker(
                platform.nats_url,
                platform.topology.namespace,
                tmp_path / "worker",
                tmp_path / "worker.log",
                "--heartbeat",
                "1",
                "--concurrency",
                "2",
                "--kill-grace",
                "2",
                "--idle-ttl",
                "60",
            )  # fmt: skip
        )
        pool = PoolSettings(heartbeat_timeout_seconds=5, ack_wait_seconds=10)
        return PoolBackend(platform.nc, platform.topology, pool)

    async with harness(platform, model, tmp_path, pool_backend, "pool") as h:
        await scenario(h)
