"""Review fixes of the sandbox backends (AREA=backends) that need no engine, cluster or server.

The process backend's activation directory is bound writable into an isolated sandbox: what
the orchestrator reads back from it (`exit_code`, `process.json`) may be a FIFO, a link or a
forgery planted by the agent, and must neither hang nor mislead the orchestrator."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from suzumio.orchestrator.backends.base import Handle
from suzumio.orchestrator.backends.docker_settings import DockerSettings
from suzumio.orchestrator.backends.process import ProcessBackend, ProcessSettings
from tests.unit.test_process_isolation_probe import plan_in


def finishes(make: Callable[[], Awaitable[Any]], unblock: Callable[[], None]) -> tuple[bool, Any]:
    """Run `make()` on an event loop of its own in a thread; (finished within 5 s, result).
    A call stuck in a blocking read is freed with `unblock` so the test itself ends."""
    result: list[Any] = []

    def run() -> None:
        result.append(asyncio.run(make()))  # type: ignore[arg-type]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(5)
    finished = not thread.is_alive()
    if not finished:
        unblock()
        thread.join(5)
    return finished, result[0] if result else None


def free_fifo(path: Path) -> Callable[[], None]:
    def unblock() -> None:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # a reader waits: a writer frees it
        os.close(fd)

    return unblock


def backend_at(tmp_path: Path) -> tuple[ProcessBackend, Path]:
    backend = ProcessBackend(tmp_path, ProcessSettings(isolate=False))
    activations = tmp_path / "activations"
    activations.mkdir()
    return backend, activations


def test_a_fifo_planted_as_exit_code_does_not_hang_the_watch(tmp_path: Path) -> None:
    """A sandbox that made `exit_code` a FIFO (its runner gone, the watch found again after a
    restart): the read must not block the orchestrator's event loop forever."""
    backend, activations = backend_at(tmp_path)
    host_dir = activations / "a1"
    host_dir.mkdir()
    os.mkfifo(host_dir / "exit_code")
    handle = Handle("a1", "process", str(2**22 + 7), {"start_time": 1, "dir": str(host_dir)})
    finished, exit_ = finishes(lambda: backend.watch(handle), free_fifo(host_dir / "exit_code"))
    assert finished, "watch blocked on a FIFO planted by the sandbox"
    assert (exit_.code, exit_.reason) == (None, "lost")


def test_a_link_planted_as_exit_code_is_not_followed(tmp_path: Path) -> None:
    """`exit_code` made a link to a file outside (or to /dev/zero: an endless read): not
    believed, not read."""
    backend, activations = backend_at(tmp_path)
    host_dir = activations / "a1"
    host_dir.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("0")
    (host_dir / "exit_code").symlink_to(elsewhere)
    handle = Handle("a1", "process", str(2**22 + 7), {"start_time": 1, "dir": str(host_dir)})
    exit_ = asyncio.run(backend.watch(handle))
    assert (exit_.code, exit_.reason) == (None, "lost")


def test_a_fifo_planted_as_the_record_does_not_hang_list_live(tmp_path: Path) -> None:
    backend, activations = backend_at(tmp_path)
    (activations / "a1").mkdir()
    os.mkfifo(activations / "a1" / "process.json")
    finished, found = finishes(backend.list_live, free_fifo(activations / "a1" / "process.json"))
    assert finished, "list_live blocked on a FIFO planted by the sandbox"
    assert found == []


def test_a_record_naming_another_activation_is_not_believed(tmp_path: Path) -> None:
    """The sandbox of a1 rewrote its `process.json` to name activation a2: after a restart the
    orchestrator would take a1's process for a2's (and stop or watch the wrong one)."""
    backend, activations = backend_at(tmp_path)
    (activations / "a1").mkdir()
    record = {"pid": os.getpid(), "start_time": 1, "activation_id": "a2"}
    (activations / "a1" / "process.json").write_text(json.dumps(record))
    (activations / "a2").mkdir()
    genuine = {"pid": 2**22 + 7, "start_time": 1, "activation_id": "a2"}
    (activations / "a2" / "process.json").write_text(json.dumps(genuine))
    # a record that is no record: its listing failed, and with it every reconciliation
    for name, bad in [("a3", {"pid": "x"}), ("a4", {"pid": None}), ("a5", [1]), ("a6", 7)]:
        (activations / name).mkdir()
        forged = {"start_time": 1, "activation_id": name, **bad} if isinstance(bad, dict) else bad
        (activations / name / "process.json").write_text(json.dumps(forged))
    found = asyncio.run(backend.list_live())
    assert [(h.activation_id, h.data["dir"]) for h in found] == [("a2", str(activations / "a2"))]


@pytest.mark.parametrize("user", ["0:0", "0:65534", "65534:0", "000:1"])
def test_docker_sandboxes_never_run_as_root(user: str) -> None:
    """DESIGN.md §10: containers are non-root. `SUZUMIO_DOCKER__USER=0:0` was accepted and
    every sandbox of a root orchestrator then ran as root."""
    with pytest.raises(ValidationError):
        DockerSettings(user=user)
    assert DockerSettings(user="65534:65534").user == "65534:65534"


async def test_a_runner_that_ends_before_it_is_recorded_is_not_taken_for_a_live_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner that fails at once on a loaded host is reaped (asyncio's child watcher thread)
    before the launch reads its start time: recorded as None, `_start_time(pid) == None` held
    for ever after — list_live called it running (the cleanup-policy test's rare flake), and a
    cancel or a reconciliation would signal the process group of whoever reuses its pid."""
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\nexit 1\n")
    script.chmod(0o755)
    real_exec = asyncio.create_subprocess_exec

    async def slow_to_come_back(*args: Any, **kwargs: Any) -> Any:
        proc = await real_exec(*args, **kwargs)
        await asyncio.sleep(0.5)  # the loop busy elsewhere: the child ends and is reaped
        return proc

    monkeypatch.setattr(asyncio, "create_subprocess_exec", slow_to_come_back)
    settings = ProcessSettings(python=str(script), isolate=False, cleanup="never")
    backend = ProcessBackend(tmp_path / "sandboxes", settings)
    plan = plan_in(tmp_path)
    handle = await backend.launch(plan)
    assert (await asyncio.wait_for(backend.watch(handle), 10)).code == 1
    signalled: list[int] = []
    monkeypatch.setattr(os, "killpg", lambda pid, sig: signalled.append(pid))
    [listed] = await backend.list_live()
    assert listed.finished  # nothing to stop
    await backend.cancel(listed)
    assert signalled == []
