"""A session's own directory (`/workspace/session`, kept across its activations) goes by the
workspace retention once the session is closed, and only then: an open session keeps it
however long it idles, and a reopened one is open again."""

from __future__ import annotations

import os
import time
from pathlib import Path

from suzumio.contracts.commands import CloseSession, ReopenSession
from suzumio.orchestrator.backends.base import Backend
from suzumio.orchestrator.backends.process import ProcessBackend
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.platform.bus.commands import CommandClient
from suzumio.testing.model_server import Reply, ScriptedModelServer
from tests.backend_suite import Harness, harness
from tests.e2e.api import World
from tests.e2e.stack import Stack

LONG_AGO = time.time() - 10 * 24 * 3600


async def process_backend(settings: OrchestratorSettings) -> Backend:
    return ProcessBackend(settings.sandboxes())


async def session_dir_of(h: Harness, name: str) -> tuple[World, Path]:
    """A world whose session ran one activation, its directory as if untouched for days."""
    world = await h.world(name)
    assert (await h.ended(await h.request(world)))[-1] == "activation.completed"
    directory = h.orchestrator._planner.settings.sandboxes() / "sessions" / world.session_id
    assert directory.is_dir()
    os.utime(directory, (LONG_AGO, LONG_AGO))
    return world, directory


async def test_a_closed_sessions_directory_goes_by_the_retention_an_open_ones_stays(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    model.script([Reply.text("done"), Reply.text("done"), Reply.text("done")])
    commands = CommandClient(platform.nc, platform.topology)
    async with harness(platform, model, tmp_path, process_backend, "process") as h:
        _, open_dir = await session_dir_of(h, "open")
        closed, closed_dir = await session_dir_of(h, "closed")
        reopened, reopened_dir = await session_dir_of(h, "reopened")
        for world in (closed, reopened):
            await commands.send(CloseSession(session_id=world.session_id), actor="system:test")
        await commands.send(ReopenSession(session_id=reopened.session_id), actor="system:test")

        await h.orchestrator._collect_garbage(time.time() - 3600)  # closed under an hour ago
        assert closed_dir.exists()

        await h.orchestrator._collect_garbage(time.time() + 1)  # as if the retention passed
        assert not closed_dir.exists()
        assert open_dir.exists()
        assert reopened_dir.exists()
