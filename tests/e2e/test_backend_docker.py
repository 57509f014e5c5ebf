"""The backend behaviour suite (tests/backend_suite.py) on the docker backend: a real engine and
the real runner image."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from suzumio.orchestrator.backends.base import Backend
from suzumio.orchestrator.backends.docker import DockerBackend, DockerSettings
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.testing.model_server import ScriptedModelServer
from tests.backend_suite import SCENARIOS, Harness, harness
from tests.e2e.stack import Stack


async def docker_backend(settings: OrchestratorSettings) -> Backend:
    return DockerBackend(DockerSettings(), settings.namespace)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
async def test_docker_backend(
    platform: Stack,
    model: ScriptedModelServer,
    tmp_path: Path,
    scenario: Callable[[Harness], Awaitable[None]],
) -> None:
    async with harness(platform, model, tmp_path, docker_backend, "docker") as h:
        await scenario(h)
