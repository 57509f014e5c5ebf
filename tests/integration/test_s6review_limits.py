"""A pool worker killed outright leaves its cgroup tree behind, and with it whatever its runs'
commands still ran (a command mid-way, a server started in the background: init's children by
then, which nobody else will ever stop). The next worker on the host ends them and removes the
tree — and never touches a tree whose worker still runs (real cgroups, which CI, as root,
can make)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from suzumio.contracts.values import ResourceLimits
from suzumio.runner import limits as sandbox_limits
from suzumio.runner.worker import CGROUP_PREFIX, _started, _tree_alive

LIMITS = ResourceLimits(cpus=0.5, memory_mb=256, pids=32)


def _gone(pid: int) -> bool:
    """Whether `pid` has ended (a zombie its new parent did not reap yet has too)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in {"Z", "X"}


def test_a_dead_workers_tree_is_emptied_of_what_outlived_it_and_removed() -> None:
    me = os.getpid()
    dead = sandbox_limits.discover(f"{CGROUP_PREFIX}s6review-gone-{2**22 + 7}-1")
    assert isinstance(dead, sandbox_limits.Cgroups), dead  # CI runs as root, with cgroups
    live = sandbox_limits.discover(f"{CGROUP_PREFIX}s6review-live-{me}-{_started(me)}")
    assert isinstance(live, sandbox_limits.Cgroups), live
    left = dead.create("run-left", LIMITS)
    # What a shell command of the dead worker's run left in the background: in its run's
    # cgroup, init's child now that its shell is gone.
    shell = subprocess.run(  # noqa: S603
        ["/bin/sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"],  # noqa: S607
        preexec_fn=left.apply,  # noqa: PLW1509 - the test's own cgroup join
        capture_output=True,
        check=True,
        timeout=10,
    )
    stray = int(shell.stdout)
    live.create("run-joining", LIMITS)  # empty until its runner joins: never swept
    try:
        assert not _gone(stray)
        live.sweep_siblings(CGROUP_PREFIX, _tree_alive)
        deadline = time.monotonic() + 15
        while not _gone(stray) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(stray)
        assert not any(p.exists() for p in dead.parents.values())
        assert live.sandboxes() == ["run-joining"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stray, signal.SIGKILL)
        live.close()
        dead.close()
