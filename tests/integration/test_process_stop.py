"""A runner stopped by the process backend keeps its exit code: the shell that records it
outlives the stop's SIGTERM, and with bubblewrap the watch waits for the sandbox's namespace,
not for bubblewrap's outer process (which the SIGTERM ends at once).

The "runner" is a stand-in script in place of the interpreter: it stands for a runner that had
recorded its output when the stop came (the runner then finishes sending it, and exits 0)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import threading
from pathlib import Path

import pytest

from suzumio.orchestrator.backends import process
from suzumio.orchestrator.backends.process import ProcessBackend, ProcessSettings
from tests.support import eventually
from tests.unit.test_process_isolation_probe import plan_in


def stand_in_runner(tmp_path: Path, script: str) -> Path:
    """`script` in place of the runner's interpreter (not above the sandboxes' directory,
    which bubblewrap masks)."""
    path = tmp_path / "r" / "bin" / "python"
    path.parent.mkdir(parents=True)
    path.write_text(script)
    path.chmod(0o755)
    return path


FINISHING = """#!/bin/sh
trap 'sleep 1; echo finished > finished; exit 0' TERM
touch ready
while :; do sleep 0.1; done
"""


@pytest.mark.parametrize(
    "isolate",
    [
        False,
        pytest.param(
            True,
            marks=pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bubblewrap"),
        ),
    ],
    ids=["plain", "bwrap"],
)
async def test_a_runner_that_finishes_after_a_stop_ends_with_its_own_exit_code(
    tmp_path: Path, isolate: bool
) -> None:
    script = stand_in_runner(tmp_path, FINISHING)
    settings = ProcessSettings(python=str(script), isolate=isolate, cgroups=False)
    backend = ProcessBackend(tmp_path / "sandboxes", settings)
    plan = plan_in(tmp_path)
    handle = await backend.launch(plan)
    workspace = plan.host_dir / "workspace"
    ready = workspace / "ready"
    await eventually(lambda: asyncio.to_thread(ready.exists), bool, what="the runner", timeout=30)

    stopping = asyncio.create_task(backend.cancel(handle))
    end = await asyncio.wait_for(backend.watch(handle), 30)
    await stopping
    assert (end.code, end.reason) == (0, "exited"), end
    assert (workspace / "finished").read_text() == "finished\n"
    await backend.cleanup(handle, succeeded=True)


SLEEPING = """#!/bin/sh
touch ready
while :; do sleep 0.1; done
"""


async def test_a_record_the_sandbox_forges_in_its_directory_is_not_what_a_leader_trusts(
    tmp_path: Path,
) -> None:
    """The activation's directory is bound writable into its sandbox: a runner's record there
    could be rewritten (a deadline far off for a restarted leader to trust, another pid) or
    deleted (the leader loses a runner that goes on). A leader that starts finds the runner
    by the record kept out of the sandbox's reach, as launch wrote it."""
    script = stand_in_runner(tmp_path, SLEEPING)
    settings = ProcessSettings(python=str(script), isolate=False, cgroups=False)
    backend = ProcessBackend(tmp_path / "sandboxes", settings)
    plan = plan_in(tmp_path)
    handle = await backend.launch(plan)
    try:
        ready = plan.host_dir / "workspace" / "ready"
        await eventually(lambda: asyncio.to_thread(ready.exists), bool, what="the runner")
        forged = {"pid": 1, "start_time": None, "activation_id": plan.activation_id,
                  "deadline": 4e9}  # fmt: skip
        (plan.host_dir / "process.json").write_text(json.dumps(forged))
        leader = ProcessBackend(tmp_path / "sandboxes", settings)
        [found] = [h for h in await leader.list_live() if h.activation_id == plan.activation_id]
        assert found.sandbox_id == handle.sandbox_id
        assert "deadline" not in found.data
        assert found.data["status"] == "running"
    finally:
        await backend.cancel(handle)
        await backend.watch(handle)
        await backend.cleanup(handle, succeeded=False)
    leader = ProcessBackend(tmp_path / "sandboxes", settings)
    assert [h.activation_id for h in await leader.list_live()] == []  # removed with its dir


STUBBORN = """#!/bin/sh
trap ':' TERM
touch ready
while :; do sleep 0.1; done
"""


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bubblewrap")
async def test_a_sandbox_whose_bubblewrap_leader_is_gone_is_still_stopped(tmp_path: Path) -> None:
    """A stop's SIGTERM ends bubblewrap's outer process at once, and the sandbox's namespace
    lives on while its runner finishes. A leader that took over then (the outer process gone,
    its pid no longer live) must still stop that group — it returned at once, and the runner
    went on to the wall clock."""
    script = stand_in_runner(tmp_path, STUBBORN)
    settings = ProcessSettings(
        python=str(script), isolate=True, cgroups=False, stop_grace_seconds=1
    )
    backend = ProcessBackend(tmp_path / "sandboxes", settings)
    plan = plan_in(tmp_path)
    handle = await backend.launch(plan)
    ready = plan.host_dir / "workspace" / "ready"
    await eventually(lambda: asyncio.to_thread(ready.exists), bool, what="the runner", timeout=30)
    watching = asyncio.create_task(backend.watch(handle))
    os.kill(int(handle.sandbox_id), signal.SIGTERM)  # the outer process only, as a stop's
    await eventually(
        lambda: asyncio.sleep(0, process._start_time(int(handle.sandbox_id))),
        lambda started: started is None,
        what="the outer process gone",
    )
    assert not watching.done()  # the namespace lives on
    successor = ProcessBackend(tmp_path / "sandboxes", settings)
    await successor.cancel(handle)
    end = await asyncio.wait_for(watching, 30)
    assert end.reason == "killed", end
    await backend.cleanup(handle, succeeded=False)


async def test_a_stop_looks_at_its_process_group_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each look at whether a stopped sandbox's group lives walks all of /proc: on a host with
    thousands of processes, one on the loop stalls every other watch of the orchestrator, up
    to thirty times in a stop's grace. They are made in a worker thread, in the stop's grace
    and in the cleanup alike."""
    script = stand_in_runner(tmp_path, FINISHING)
    settings = ProcessSettings(python=str(script), isolate=False, cgroups=False)
    backend = ProcessBackend(tmp_path / "sandboxes", settings)
    plan = plan_in(tmp_path)
    handle = await backend.launch(plan)
    ready = plan.host_dir / "workspace" / "ready"
    await eventually(lambda: asyncio.to_thread(ready.exists), bool, what="the runner", timeout=30)
    on_loop: list[bool] = []
    group_alive = process._group_alive

    def noting(group: int) -> bool:
        on_loop.append(threading.current_thread() is threading.main_thread())
        return group_alive(group)

    monkeypatch.setattr(process, "_group_alive", noting)
    stopping = asyncio.create_task(backend.cancel(handle))
    await asyncio.wait_for(backend.watch(handle), 30)
    await stopping
    await backend.cleanup(handle, succeeded=True)
    assert on_loop  # the grace looked (the runner takes a second to finish)
    assert not any(on_loop)
