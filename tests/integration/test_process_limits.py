"""The process backend holds a runner, and everything it starts, to the runtime profile's
limits: in a cgroup of the activation's own where the host allows one (this machine, as root:
cgroup v1 memory/pids/cpu hierarchies), by rlimits otherwise — and says what it cannot hold.

The "runner" here is a stand-in script in place of the interpreter: the backend starts
`<python> -m suzumio.runner run input.json`, and what the script starts stands for what the
runner's shell commands would (they inherit the same limits)."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from suzumio.contracts.values import ResourceLimits, RuntimeProfileSpec
from suzumio.orchestrator.backends.base import LaunchPlan
from suzumio.orchestrator.backends.process import CGROUP_OWNER, ProcessBackend, ProcessSettings
from suzumio.runner import limits as sandbox_limits
from tests.integration.test_process_stop import stand_in_runner
from tests.support import eventually
from tests.unit.test_process_isolation_probe import plan_in

LIMITS = ResourceLimits(cpus=0.5, memory_mb=256, pids=32)

# Over the memory limit, well under it, and as many processes as it may start (60 at most).
PROBE = f"""#!/bin/sh
PY={sys.executable}
$PY -c 'b = b"x" * (768 << 20)' 2>/dev/null; echo "big=$?" > probe.txt
$PY -c 'b = b"x" * (16 << 20)'; echo "small=$?" >> probe.txt
$PY -c '
import os, time
n = 0
try:
    for _ in range(60):
        if os.fork() == 0:
            time.sleep(1)
            os._exit(0)
        n += 1
except OSError:
    pass
for _ in range(n):
    os.wait()
print("forked=%d" % n)
' >> probe.txt
cat /proc/self/cgroup | sed "s/^/cgroup=/" >> probe.txt
echo ready >> probe.txt
i=0; while [ ! -e go ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
exit 0
"""


def probe_runner(tmp_path: Path) -> Path:
    script = tmp_path / "bin" / "python"
    script.parent.mkdir(parents=True)
    script.write_text(PROBE)
    script.chmod(0o755)
    return script


def with_limits(plan: LaunchPlan) -> LaunchPlan:
    return replace(plan, profile=RuntimeProfileSpec(limits=LIMITS))


async def run_probe(
    backend: ProcessBackend, plan: LaunchPlan, while_running: object = None
) -> dict[str, list[str]]:
    handle = await backend.launch(plan)
    probe = plan.host_dir / "workspace" / "probe.txt"
    await eventually(
        lambda: asyncio.to_thread(lambda: probe.read_text() if probe.exists() else ""),
        lambda text: "ready" in text,
        what="the probe's report",
        timeout=60,
    )
    facts: dict[str, list[str]] = {}
    for line in probe.read_text().splitlines():
        key, _, value = line.partition("=")
        facts.setdefault(key, []).append(value)
    if callable(while_running):
        facts["seen"] = [str(while_running())]
    (plan.host_dir / "workspace" / "go").touch()
    end = await asyncio.wait_for(backend.watch(handle), 30)
    assert end.code == 0, end
    await backend.cleanup(handle, succeeded=True)
    return facts


@pytest.mark.parametrize("isolate", [False, True], ids=["plain", "bwrap"])
async def test_a_runner_and_what_it_starts_are_held_to_the_profile_in_a_cgroup(
    tmp_path: Path, isolate: bool
) -> None:
    settings = ProcessSettings(python=str(probe_runner(tmp_path / "r")), isolate=isolate)
    backend = ProcessBackend(tmp_path / "sandboxes", settings)
    found = sandbox_limits.discover(backend.cgroup_owner)
    assert isinstance(found, sandbox_limits.Cgroups), f"this host has cgroups to use: {found}"
    plan = with_limits(plan_in(tmp_path))

    def cpu_quota() -> str:
        cpu = found.parents["cpu"] / plan.activation_id
        if found.version == 2:
            return (cpu / "cpu.max").read_text().split()[0]
        return (cpu / "cpu.cfs_quota_us").read_text().strip()

    facts = await run_probe(backend, plan, cpu_quota)

    assert facts["big"] != ["0"], facts  # 768 MB of a 256 MB profile
    assert facts["small"] == ["0"], facts
    forked = int(facts["forked"][0])
    assert 0 < forked < 32, facts  # the shell and the interpreter count too
    assert any(plan.activation_id in line for line in facts["cgroup"]), facts
    assert facts["seen"] == ["50000"], facts  # 0.5 CPU of a 100 ms period
    assert plan.activation_id not in found.sandboxes(), "the cgroup outlived the cleanup"
    health = await backend.health()
    limits = health.detail["limits"]
    assert isinstance(limits, dict)
    assert limits["mechanism"] == f"cgroup{found.version}"
    assert "unenforced" not in limits


async def test_without_cgroups_rlimits_hold_the_memory_and_health_says_what_is_not_held(
    tmp_path: Path,
) -> None:
    settings = ProcessSettings(python=str(probe_runner(tmp_path)), isolate=False, cgroups=False)
    backend = ProcessBackend(tmp_path / "sandboxes", settings)
    facts = await run_probe(backend, with_limits(plan_in(tmp_path)))

    assert facts["big"] != ["0"], facts
    assert facts["small"] == ["0"], facts
    health = await backend.health()
    limits = health.detail["limits"]
    assert isinstance(limits, dict)
    assert limits["mechanism"] == "rlimits"
    assert "cpus" in limits["unenforced"]  # no rate limit without a cgroup, and it is said
    assert "turned off" in limits["cgroup_problem"]


async def test_the_reconciliation_sweeps_the_empty_cgroup_of_an_activation_gone(
    tmp_path: Path,
) -> None:
    """An orchestrator killed in a cleanup, after the directory went: its next `list_live`
    removes the cgroup left (an empty one only)."""
    backend = ProcessBackend(tmp_path / "sandboxes", ProcessSettings(isolate=False))
    found = sandbox_limits.discover(backend.cgroup_owner)
    assert isinstance(found, sandbox_limits.Cgroups), found
    plan = plan_in(tmp_path)
    found.create(plan.activation_id, LIMITS)
    assert plan.activation_id in found.sandboxes()
    assert await backend.list_live() == []
    assert plan.activation_id not in found.sandboxes()


async def test_the_sweep_leaves_another_orchestrators_cgroups_alone(tmp_path: Path) -> None:
    """Two orchestrators on one host (two installations, or tests side by side): one's
    reconciliation must not remove the empty cgroup the other just made for a runner about to
    join it — that launch failed ("cannot start the runner"). Each sandboxes directory has
    its own tree."""
    first = ProcessBackend(tmp_path / "one", ProcessSettings(isolate=False))
    second = ProcessBackend(tmp_path / "two", ProcessSettings(isolate=False))
    assert first.cgroup_owner != second.cgroup_owner
    assert first.cgroup_owner.startswith(CGROUP_OWNER)
    found = sandbox_limits.discover(first.cgroup_owner)
    assert isinstance(found, sandbox_limits.Cgroups), found
    plan = plan_in(tmp_path)
    try:
        found.create(plan.activation_id, LIMITS)  # the first's launch, its runner not in yet
        assert await second.list_live() == []
        assert plan.activation_id in found.sandboxes()
        # Closing, an orchestrator leaves its tree only while a sandbox's cgroup is in it.
        await second.close()
        theirs = [p.parent / second.cgroup_owner for p in found.parents.values()]
        assert not any(p.exists() for p in theirs), theirs
        found.release()
        assert all(p.is_dir() for p in found.parents.values())
        found.remove(plan.activation_id)
        found.release()
        assert not any(p.exists() for p in found.parents.values())
    finally:
        found.close()


async def test_a_replica_closing_does_not_break_the_launches_of_one_sharing_its_tree(
    tmp_path: Path,
) -> None:
    """Replicas with one sandboxes directory share its tree; one that closes while nothing
    runs removes it, empty. The other's next launch made its cgroup in a tree that was gone
    ("cannot make the activation's cgroup"), and every launch after it, until it restarted."""
    staying = ProcessBackend(tmp_path / "shared", ProcessSettings(isolate=False))
    leaving = ProcessBackend(tmp_path / "shared", ProcessSettings(isolate=False))
    assert staying.cgroup_owner == leaving.cgroup_owner
    found = sandbox_limits.discover(staying.cgroup_owner)
    assert isinstance(found, sandbox_limits.Cgroups), found
    assert (await leaving.health()).ok
    await leaving.close()
    assert not any(p.exists() for p in found.parents.values())  # the tree went with it
    plan = plan_in(tmp_path)
    try:
        sandbox = found.create(plan.activation_id, LIMITS)
        assert plan.activation_id in found.sandboxes()
        assert all(Path(procs).exists() for procs in sandbox.procs)
        if found.version == 1:
            memory = found.parents["memory"] / plan.activation_id / "memory.limit_in_bytes"
            assert int(memory.read_text()) == LIMITS.memory_mb << 20
            # This host accounts swap: none beyond the limit.
            swap = memory.with_name("memory.memsw.limit_in_bytes")
            assert int(swap.read_text()) == LIMITS.memory_mb << 20
    finally:
        found.close()


OOM = f"""#!/bin/sh
{sys.executable} -c 'b = b"x" * (64 << 20)' && echo "a tool's child could go over: fine" > tool.txt
exec {sys.executable} -c 'b = b"x" * (768 << 20)'
"""


async def test_a_runner_killed_at_its_memory_limit_ends_out_of_memory(tmp_path: Path) -> None:
    """The kernel kills the runner at its cgroup's memory limit: the end says out of memory
    (not retried: the same work needs the same memory), not a plain exit 137 — which the
    scheduler retried until its budget was spent."""
    script = stand_in_runner(tmp_path, OOM)
    backend = ProcessBackend(tmp_path / "sandboxes", ProcessSettings(python=str(script)))
    tight = replace(
        plan_in(tmp_path),
        profile=RuntimeProfileSpec(limits=ResourceLimits(cpus=1, memory_mb=128, pids=32)),
    )
    handle = await backend.launch(tight)
    end = await asyncio.wait_for(backend.watch(handle), 60)
    await backend.cleanup(handle, succeeded=False)
    assert (end.reason, end.code) == ("oom", 137), end


@pytest.mark.parametrize(
    ("then", "code"), [("exit 0", 0), ("kill -TERM $$", 143)], ids=["exits", "other_signal"]
)
async def test_a_runner_that_outlives_an_oom_kill_of_its_command_ends_as_it_ends(
    tmp_path: Path, then: str, code: int
) -> None:
    """What a command of the runner's starts may be killed at the limit (the cgroup counts
    it; the runner reads it as the command's failure): the runner's own end is what counts,
    its exit or another signal — out of memory is only a runner the kernel SIGKILLed."""
    big = f"{sys.executable} -c 'b = b\"x\" * (768 << 20)'"
    script = stand_in_runner(tmp_path, f"#!/bin/sh\n{big}\n{then}\n")
    backend = ProcessBackend(tmp_path / "sandboxes", ProcessSettings(python=str(script)))
    handle = await backend.launch(with_limits(plan_in(tmp_path)))
    end = await asyncio.wait_for(backend.watch(handle), 60)
    await backend.cleanup(handle, succeeded=code == 0)
    assert (end.reason, end.code) == ("exited", code), end
