"""`suzumio agents import DIR` against the running API."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from tests.e2e.api import new_world, ok
from tests.e2e.stack import Stack
from tests.e2e.test_api_agents_sessions import AGENT_YAML


async def cli(stack: Stack, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SUZUMIO_API_URL": stack.api, "SUZUMIO_API_KEY": key, "COLUMNS": "200"}
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "suzumio.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_import_a_package_directory(stack: Stack, tmp_path: Path) -> None:
    world = await new_world(stack, "cli-user")
    package = tmp_path / "reviewer"
    (package / "prompt").mkdir(parents=True)
    (package / "agent.yaml").write_bytes(AGENT_YAML)
    (package / "prompt" / "system.md").write_text("Review with care.")
    (package / "notes.md").write_text("house rules")

    done = await cli(
        stack, world.key, "agents", "import", str(package), "--project", world.project_id
    )

    assert done.returncode == 0, done.stdout + done.stderr
    agent_id = done.stdout.strip().rsplit(" ", 1)[-1]
    async with stack.client(world.key) as c:
        agent = ok(await c.get(f"/v1/agents/{agent_id}"))
    assert (agent["name"], agent["prompt"]) == ("reviewer", "Review with care.")
    assert [a["path"] for a in agent["assets"]] == ["notes.md"]

    (package / "agent.yaml").write_text("name: broken\n")
    refused = await cli(
        stack, world.key, "agents", "import", str(package), "--project", world.project_id
    )
    assert refused.returncode == 1
    assert "422" in refused.stdout
