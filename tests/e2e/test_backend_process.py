"""The backend behaviour suite (tests/backend_suite.py) on the process backend."""

from __future__ import annotations

import re
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from suzumio.orchestrator.backends.base import Backend
from suzumio.orchestrator.backends.process import ProcessBackend
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from tests.backend_suite import SCENARIOS, Harness, harness
from tests.e2e.api import World
from tests.e2e.stack import Stack
from tests.support import eventually


async def process_backend(settings: OrchestratorSettings) -> Backend:
    return ProcessBackend(settings.sandboxes())


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
async def test_process_backend(
    platform: Stack,
    model: ScriptedModelServer,
    tmp_path: Path,
    scenario: Callable[[Harness], Awaitable[None]],
) -> None:
    async with harness(platform, model, tmp_path, process_backend, "process") as h:
        await scenario(h)


async def run_shell(h: Harness, name: str, command: str) -> World:
    """One activation of a new world whose model runs `command` in the sandbox, then answers;
    it must complete."""
    h.model.script(
        [
            Reply.tool_calls([ToolCall("shell_exec", {"command": command})]),
            Reply.text("done"),
        ]
    )
    world = await h.world(name)
    activation_id = await h.request(world)
    assert (await h.ended(activation_id))[-1] == "activation.completed"
    return world


async def test_with_bubblewrap_the_runner_sees_and_changes_only_its_own(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    """bubblewrap isolation (installed by `tools/docker_engine.py` as root): a shell command of
    the agent cannot write outside its workspace, sees no host process, holds no capability,
    and finds the platform's data directory empty."""
    assert shutil.which("bwrap"), "bubblewrap is missing: `python3 tools/docker_engine.py`"
    secret = tmp_path / "secret.txt"
    secret.write_text("the platform's own")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    command = "; ".join(
        [
            f"touch {outside}/x 2>/dev/null; echo OUTSIDE=$?",
            "touch /usr/x 2>/dev/null; echo SYSTEM=$?",
            "echo made > out/made.txt; echo OWN=$?",
            "echo PROCS=$(ls /proc | grep -c '^[0-9]')",
            "grep CapEff /proc/self/status",
            f"cat {secret} 2>/dev/null; echo SECRET=$?",
        ]
    )
    async with harness(platform, model, tmp_path, process_backend, "process") as h:
        world = await run_shell(h, "bwrap", command)
    [result] = [
        str(m.get("content"))
        for r in model.requests
        if world.session_id in str(r.messages[0])
        for m in r.messages
        if m.get("role") == "tool"
    ]
    facts = dict(re.findall(r"(OUTSIDE|SYSTEM|OWN|PROCS|SECRET)=(\d+)", result))
    assert facts["OUTSIDE"] != "0", result
    assert facts["SYSTEM"] != "0", result
    assert facts["OWN"] == "0", result
    # bwrap's init, the runner, its shell and the command's: none of the host's many.
    host = sum(1 for p in Path("/proc").iterdir() if p.name.isdigit())
    assert int(facts["PROCS"]) <= 10 < host, (result, host)
    assert "CapEff:\t0000000000000000" in result, result
    assert facts["SECRET"] != "0", result
    assert "the platform's own" not in result
    assert list(outside.iterdir()) == []


async def test_an_out_file_no_workspace_could_hold_is_left_out(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    """A name with a backslash cannot come back as `in/<path>`: it is not recorded, and the
    activation's other files and its end are as usual."""
    command = "printf one > 'out/a\\b.txt'; printf two > out/ok.txt"
    async with harness(platform, model, tmp_path, process_backend, "process") as h:
        world = await run_shell(h, "names", command)
        async with platform.client(world.key) as c:
            listed = await eventually(
                lambda: c.get(f"/v1/projects/{world.project_id}/artifacts"),
                lambda r: r.status_code == 200 and len(r.json()["items"]) >= 1,
                what="the artifacts",
            )
    assert [a["path"] for a in listed.json()["items"]] == ["ok.txt"]
