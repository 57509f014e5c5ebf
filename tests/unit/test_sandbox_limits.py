"""`suzumio.runner.limits` finds the host's cgroups from this process's mountinfo and cgroup
files, and lays out a sandbox's cgroup with the profile's limits. This machine has cgroup v1
(tests/integration/test_process_limits.py uses it for real); the unified hierarchy (v2) is
played here by plain directories standing in for the cgroup filesystem."""

from __future__ import annotations

import os
import resource
from pathlib import Path

from suzumio.contracts.values import ResourceLimits
from suzumio.runner import limits

LIMITS = ResourceLimits(cpus=1.5, memory_mb=512, pids=64, disk_mb=100)


def fake_v2(tmp_path: Path, controllers: str = "cpuset cpu io memory hugetlb pids") -> Path:
    """/proc/self of a process in `/system.slice/suzumio.service` of a cgroup2 mount."""
    mount = tmp_path / "cgroup"
    own = mount / "system.slice" / "suzumio.service"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text(controllers + "\n")
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "mountinfo").write_text(
        "22 1 0:21 / /sys rw,nosuid shared:2 - sysfs sysfs rw\n"
        f"30 22 0:26 / {mount} rw,nosuid,nodev,noexec shared:4 - cgroup2 cgroup2 rw\n"
    )
    (proc / "cgroup").write_text("0::/system.slice/suzumio.service\n")
    return proc


def test_v2_gives_each_sandbox_memory_pids_and_cpu_under_the_processs_own_cgroup(
    tmp_path: Path,
) -> None:
    found = limits.discover("suzumio-process", fake_v2(tmp_path))
    assert isinstance(found, limits.Cgroups), found
    own = tmp_path / "cgroup" / "system.slice" / "suzumio.service"
    parent = own / "suzumio-process"
    assert found.version == 2
    assert set(found.parents.values()) == {parent}
    # Controllers handed down to the owner's directory and from it to each sandbox.
    assert (own / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert (parent / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"

    sandbox = found.create("act-1", LIMITS)

    cgroup = parent / "act-1"
    assert (cgroup / "memory.max").read_text() == str(512 * 1024 * 1024)
    assert (cgroup / "pids.max").read_text() == "64"
    assert (cgroup / "cpu.max").read_text() == "150000 100000"
    assert sandbox.procs == (str(cgroup / "cgroup.procs"),)
    # In a cgroup: no per-process memory or process rlimit, only the file size and no cores.
    assert dict(sandbox.rlimits) == {
        resource.RLIMIT_CORE: 0,
        resource.RLIMIT_FSIZE: 100 * 1024 * 1024,
    }
    assert found.sandboxes() == ["act-1"]
    assert limits.Sandbox.from_json(sandbox.to_json()) == sandbox  # as a fork server gets it
    assert not (cgroup / "memory.swap.max").exists()  # no swap accounting: not made up

    # Where the kernel accounts swap (the file is there as the cgroup is made): none.
    (parent / "act-2").mkdir()
    (parent / "act-2" / "memory.swap.max").write_text("max")
    found.create("act-2", LIMITS)
    assert (parent / "act-2" / "memory.swap.max").read_text() == "0"


def test_v2_without_the_controllers_is_no_cgroup_and_says_why(tmp_path: Path) -> None:
    found = limits.discover("suzumio-process", fake_v2(tmp_path, controllers="cpuset io"))
    assert isinstance(found, str)
    assert "memory" in found


def test_without_a_cgroup_memory_and_processes_are_rlimits() -> None:
    got = dict(limits.rlimits(LIMITS, contained=False))
    assert got[resource.RLIMIT_DATA] == 512 * 1024 * 1024
    assert got[resource.RLIMIT_FSIZE] == 100 * 1024 * 1024
    if os.getuid() == 0:  # root is never held to RLIMIT_NPROC: said unenforced instead
        assert resource.RLIMIT_NPROC not in got
        assert "pids" in limits.rlimit_enforcement("none").unenforced
    else:  # the user's processes now, and the profile's on top
        assert got[resource.RLIMIT_NPROC] > LIMITS.pids
    assert "cpus" in limits.rlimit_enforcement("none").unenforced
