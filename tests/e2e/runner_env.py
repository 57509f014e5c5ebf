"""Shared pieces of the runner tests: the launcher bound to a platform stack, posting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from suzumio.testing.model_server import ScriptedModelServer
from tests.e2e.api import World, ok
from tests.e2e.stack import Stack
from tests.runner_support import RunnerLauncher


def launcher(stack: Stack, model: ScriptedModelServer, tmp_path: Path, **kw: Any) -> RunnerLauncher:
    return RunnerLauncher(
        stack.nc,
        stack.topology,
        stack.store,
        stack.secret_key,
        stack.url_of("toolbroker"),
        model.url,
        tmp_path,
        **kw,
    )


async def post(stack: Stack, world: World, text: str, **extra: Any) -> dict[str, Any]:
    async with stack.client(world.key) as c:
        body: dict[str, Any] = ok(
            await c.post(f"/v1/sessions/{world.session_id}/messages", json={"text": text, **extra}),
            201,
        )
    return body
