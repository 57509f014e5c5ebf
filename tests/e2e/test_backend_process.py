"""The backend behaviour suite (tests/backend_suite.py) on the process backend."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.events import ActivationCancelRequested
from suzumio.contracts.ids import new_id
from suzumio.orchestrator.backends.base import Backend
from suzumio.orchestrator.backends.process import ProcessBackend
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from tests.backend_suite import SCENARIOS, TERMINAL, Harness, harness
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


def holding(*needles: str) -> list[int]:
    """The pids of the processes whose command line holds one of `needles`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(n in cmdline for n in needles):
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
@pytest.mark.parametrize("end", ["cancel", "timeout"])
async def test_with_bubblewrap_a_stop_ends_everything_in_the_sandbox(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path, end: str
) -> None:
    """A cancel or the wall-clock timeout stops the whole sandbox, not only bubblewrap's
    outer process: no process is left whose command line names the activation's directory
    (bwrap, the runner's shell and the runner) or the agent's command running inside."""
    marker = f"still-running-{new_id()[-8:]}"
    model.script(
        [
            Reply.tool_calls([ToolCall("shell_exec", {"command": f"sleep 777; echo {marker}"})]),
            Reply.text("never"),
        ]
    )
    sandboxes = str(tmp_path / "sandboxes")
    try:
        async with harness(platform, model, tmp_path, process_backend, "process") as h:
            world = await h.world("stop", wall_clock=8 if end == "timeout" else None)
            activation_id = await h.request(world)
            await eventually(
                lambda: asyncio.sleep(0, holding(marker)), bool, timeout=60, what="the command"
            )
            if end == "cancel":
                await h.stack.store.append_next(
                    world.session_id,
                    [ActivationCancelRequested(activation_id=activation_id, reason="test")],
                    EventMeta(actor="system:scheduler"),
                )
            story = await h.ended(activation_id, timeout=60)
            expected = "activation.cancelled" if end == "cancel" else "activation.timed_out"
            assert [t for t in story if t in TERMINAL] == [expected], story
            left = await eventually(
                lambda: asyncio.sleep(0, holding(sandboxes, marker)),
                lambda pids: not pids,
                timeout=15,
                what="the sandbox's processes to end",
            )
            assert left == []
    finally:  # what a failed stop left behind, started by this test
        for pid in holding(sandboxes, marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
