"""A runner stopped by the process backend keeps its exit code: the shell that records it
outlives the stop's SIGTERM, and with bubblewrap the watch waits for the sandbox's namespace,
not for bubblewrap's outer process (which the SIGTERM ends at once).

The "runner" is a stand-in script in place of the interpreter: it stands for a runner that had
recorded its output when the stop came (the runner then finishes sending it, and exits 0)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from suzumio.orchestrator.backends.process import ProcessBackend, ProcessSettings
from tests.support import eventually
from tests.unit.test_process_isolation_probe import plan_in

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
    script = tmp_path / "r" / "bin" / "python"  # not above the sandboxes (masked in bwrap)
    script.parent.mkdir(parents=True)
    script.write_text(FINISHING)
    script.chmod(0o755)
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
