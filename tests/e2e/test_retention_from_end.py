"""Workspace retention counts from an activation's end (docs/orchestrator.md), not from its
launch: the directory of an activation that ran longer than the retention stays for the
retention after it ended. On docker (real engine) nothing else touches the directory at the
end, so its time was its launch's."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from suzumio.orchestrator.backends.base import Backend
from suzumio.orchestrator.backends.docker import DockerBackend, DockerSettings
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.testing.model_server import Reply, ScriptedModelServer
from tests.backend_suite import harness
from tests.e2e.stack import Stack

HOUR = 3600.0


async def docker_backend(settings: OrchestratorSettings) -> Backend:
    return DockerBackend(DockerSettings(), settings.namespace)


async def test_a_directory_is_retained_from_its_activations_end(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    model.script([Reply.text("done", delay=2.0)])
    async with harness(platform, model, tmp_path, docker_backend, "docker") as h:
        world = await h.world("retained")
        activation_id = await h.request(world)
        directory = h.orchestrator._planner.settings.activation_dir(activation_id)
        while not directory.exists():  # launched ...
            await asyncio.sleep(0.02)
        launched_long_ago = time.time() - 2 * HOUR  # ... as if it had run for two hours
        os.utime(directory, (launched_long_ago, launched_long_ago))
        assert (await h.ended(activation_id))[-1] == "activation.completed"

        await h.orchestrator._collect_garbage(time.time() - HOUR)  # a retention of one hour

        assert directory.exists()
        assert directory.stat().st_mtime > time.time() - 60
