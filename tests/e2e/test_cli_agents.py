"""`suzumio agents import DIR` against the running API."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from suzumio.cli.agents import pack
from suzumio.contracts.ids import new_id
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


def reviewer_package(tmp_path: Path) -> Path:
    package = tmp_path / "reviewer"
    (package / "prompt").mkdir(parents=True)
    (package / "agent.yaml").write_bytes(AGENT_YAML)
    (package / "prompt" / "system.md").write_text("Review with care.")
    (package / "notes.md").write_text("house rules")
    return package


async def test_import_a_package_directory(stack: Stack, tmp_path: Path) -> None:
    world = await new_world(stack, "cli-user")
    package = reviewer_package(tmp_path)

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
    assert "422" in refused.stderr
    assert refused.stdout == ""  # `A=$(suzumio agents import ...)` takes no refusal


async def test_update_an_agent_from_a_new_version_of_its_package(
    stack: Stack, tmp_path: Path
) -> None:
    world = await new_world(stack, "cli-updater")
    package = reviewer_package(tmp_path)
    async with stack.client(world.key) as c:
        path = f"/v1/projects/{world.project_id}/agents/import"
        archive = {"package": ("p.tar.gz", pack(package), "application/gzip")}
        agent_id = ok(await c.post(path, files=archive), 201)["id"]

    (package / "prompt" / "system.md").write_text("Review briefly.")
    (package / "notes.md").unlink()
    (package / "style.md").write_text("short sentences")
    done = await cli(stack, world.key, "agents", "update", agent_id, str(package))

    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == f"agent reviewer updated: {agent_id}"
    async with stack.client(world.key) as c:
        agent = ok(await c.get(f"/v1/agents/{agent_id}"))
    assert agent["prompt"] == "Review briefly."
    assert [a["path"] for a in agent["assets"]] == ["style.md"]

    # Refused: one line, exit 1, the agent unchanged.
    missing = await cli(stack, world.key, "agents", "update", new_id(), str(package))
    assert missing.returncode == 1
    assert "404: agent not found" in missing.stderr.splitlines(), missing.stderr
    assert missing.stdout == ""
    (package / "agent.yaml").write_text("name: broken\n")
    refused = await cli(stack, world.key, "agents", "update", agent_id, str(package))
    assert refused.returncode == 1
    assert any(line.startswith("422: ") for line in refused.stderr.splitlines()), refused.stderr
    async with stack.client(world.key) as c:
        assert ok(await c.get(f"/v1/agents/{agent_id}"))["prompt"] == "Review briefly."
