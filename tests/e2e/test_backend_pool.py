"""The backend behaviour suite (tests/backend_suite.py) on the pool backend: a real worker
process (`python -m suzumio.runner worker`) pulls the dispatches from the ACTIVATIONS work
queue and runs each runner as a process sandbox of its own — with warm sessions, so each
activation runs on its session's resident runner (tests/integration/test_pool_backend.py covers
runners forked per activation, and a resident runner kept for a session's next ones)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from suzumio.orchestrator import engine
from suzumio.orchestrator.backends.base import Backend
from suzumio.orchestrator.backends.pool import PoolBackend, PoolSettings
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from tests.backend_suite import SCENARIOS, TERMINAL, Harness, harness
from tests.e2e.stack import Stack
from tests.support import eventually, start_pool_worker


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


def pool_factory(
    platform: Stack,
    tmp_path: Path,
    workers: list[subprocess.Popen[bytes]],
    heartbeat_timeout: float = 5,
) -> Callable[[OrchestratorSettings], Awaitable[Backend]]:
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
        pool = PoolSettings(
            heartbeat_timeout_seconds=heartbeat_timeout, ack_wait_seconds=heartbeat_timeout * 2
        )
        backend = PoolBackend(platform.nc, platform.topology, pool)
        # Present once its fork server is warm and it pulls: a dispatch with a wall clock of a
        # few seconds, queued before, could be past its deadline when the worker takes it.
        await eventually(
            backend.health,
            lambda health: bool(health.detail.get("pools", {}).get("default", {}).get("workers")),
            timeout=60,
            what="the pool worker present",
        )
        return backend

    return pool_backend


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
async def test_pool_backend(
    platform: Stack,
    model: ScriptedModelServer,
    tmp_path: Path,
    workers: list[subprocess.Popen[bytes]],
    scenario: Callable[[Harness], Awaitable[None]],
) -> None:
    factory = pool_factory(platform, tmp_path, workers)
    async with harness(platform, model, tmp_path, factory, "pool") as h:
        await scenario(h)


def shell(*commands: str) -> list[Reply]:
    return [Reply.tool_calls([ToolCall("shell_exec", {"command": c})]) for c in commands]


async def pid_in(root: Path, name: str) -> int:
    async def found() -> list[Path]:
        return [p for p in root.rglob(name) if p.read_text().strip()]

    [path] = await eventually(found, bool, timeout=30, what=name)
    return int(path.read_text())


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return int(stat[stat.rfind(b")") + 2 :].split()[1])


async def adopter_of(pid: int) -> int:
    """The runner that took `pid` in once its parent (the shell that started it) exited: until
    then the parent is that shell, alive or exiting."""

    async def parent() -> tuple[int, bytes]:
        ppid = parent_of(pid)
        with contextlib.suppress(OSError):
            return ppid, Path(f"/proc/{ppid}/cmdline").read_bytes()
        return ppid, b""

    found = await eventually(
        parent, lambda p: b"suzumio.runner" in p[1], timeout=10, what="the runner adopts it"
    )
    return found[0]


def gone(pids: list[int]) -> bool:
    return not any(Path(f"/proc/{pid}").exists() for pid in pids)  # ended and reaped


async def test_what_an_activations_commands_leave_running_ends_with_it(
    platform: Stack,
    model: ScriptedModelServer,
    tmp_path: Path,
    workers: list[subprocess.Popen[bytes]],
) -> None:
    """A background process of a finished command — in the command's process group, or in a
    session of its own — ends when its activation does, on a resident runner that stays."""
    factory = pool_factory(platform, tmp_path, workers)
    async with harness(platform, model, tmp_path, factory, "pool") as h:
        h.model.script(
            [
                *shell(
                    "sleep 301 >/dev/null 2>&1 & echo $! > grouped.pid; "
                    "setsid sleep 302 >/dev/null 2>&1 & echo $! > alone.pid"
                ),
                Reply.text("done"),
            ]
        )
        activation_id = await h.request(await h.world("strays"))
        assert (await h.ended(activation_id))[-1] == "activation.completed"
        left = [await pid_in(tmp_path, "grouped.pid"), await pid_in(tmp_path, "alone.pid")]
        await eventually(lambda: asyncio.sleep(0, gone(left)), bool, timeout=10, what="ended")


async def test_what_a_killed_runners_commands_leave_running_ends_with_it(
    platform: Stack,
    model: ScriptedModelServer,
    tmp_path: Path,
    workers: list[subprocess.Popen[bytes]],
) -> None:
    """The runner killed outright (SIGKILL: it can end nothing) while one command runs and an
    earlier one's background process lives: the fork server, which its orphans go to, ends
    them all."""
    factory = pool_factory(platform, tmp_path, workers)
    async with harness(platform, model, tmp_path, factory, "pool") as h:
        h.model.script(
            [
                *shell("sleep 303 >/dev/null 2>&1 & echo $! > earlier.pid", "sleep 600"),
                Reply.text("never"),
            ]
        )
        activation_id = await h.request(await h.world("killed"))
        earlier = await pid_in(tmp_path, "earlier.pid")
        runner = await adopter_of(earlier)  # the runner took the orphan in
        await h.model.wait_for_requests(2, timeout=30)
        await asyncio.sleep(0.5)  # the second command runs
        descendants = [earlier]
        for pid in (p for p in Path("/proc").iterdir() if p.name.isdigit()):
            with contextlib.suppress(OSError, ValueError):
                ancestor = parent_of(int(pid.name))
                while ancestor > 1 and ancestor != runner:
                    ancestor = parent_of(ancestor)
                if ancestor == runner:
                    descendants.append(int(pid.name))
        assert len(descendants) >= 3, descendants  # earlier, the shell, its sleep 600
        os.kill(runner, signal.SIGKILL)
        await h.ended(activation_id)
        await eventually(
            lambda: asyncio.sleep(0, gone(descendants)), bool, timeout=10, what="ended"
        )


async def test_a_worker_frozen_at_the_timeout_still_ends_it_timed_out(
    platform: Stack,
    model: ScriptedModelServer,
    tmp_path: Path,
    workers: list[subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker frozen (SIGSTOP) when the wall clock runs out: the stop is not answered
    within its grace (shortened here below the heartbeat timeout), and the activation still
    ends as timed out — not as an error of the orchestrator's."""
    monkeypatch.setattr(engine, "STOP_GRACE_SECONDS", 1.0)
    factory = pool_factory(platform, tmp_path, workers, heartbeat_timeout=60)
    async with harness(platform, model, tmp_path, factory, "pool") as h:
        h.model.script([Reply.text("never in time", delay=60)])
        activation_id = await h.request(await h.world("frozen", wall_clock=4))
        await h.model.wait_for_requests(1, timeout=30)  # the worker started its runner
        os.kill(workers[0].pid, signal.SIGSTOP)
        try:
            story = await h.ended(activation_id, timeout=60)
        finally:
            os.kill(workers[0].pid, signal.SIGCONT)
    assert [t for t in story if t in TERMINAL] == ["activation.timed_out"], story
