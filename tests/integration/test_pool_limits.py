"""A pool worker holds each run — a runner it starts, one its fork server forks, a warm
session's resident runner — to the dispatch's runtime profile limits (a cgroup per run where
the host allows, as here: root with cgroup v1; rlimits otherwise), and keeps a session warm no
longer than the profile's `idle_seconds` (real NATS; the pool backend sends the dispatches).

Where a run's commands must be seen at work, the worker runs in this process with cold
runners and a stand-in script as its interpreter: the runner it starts is the script, which
does what an agent's shell commands would (they inherit the same limits)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from suzumio.contracts.ids import new_id
from suzumio.contracts.runner import FileRef
from suzumio.contracts.subjects import ARTIFACTS_BUCKET, Topology
from suzumio.contracts.values import Backend, ResourceLimits, RuntimeProfileSpec, Timeouts
from suzumio.orchestrator.backends.base import Handle, LaunchPlan
from suzumio.orchestrator.backends.pool import PoolBackend
from suzumio.platform.bus.kv import ensure_object_store
from suzumio.runner import exchange
from suzumio.runner import limits as sandbox_limits
from suzumio.runner.worker import CGROUP_PREFIX, Worker, WorkerConfig, _started
from tests.integration.test_pool_backend import (  # noqa: F401 - fixtures
    Hanging,
    StartWorker,
    Statuses,
    backend,
    fenced_url,
    hanging,
    make_plan,
    statuses,
    wait_workers,
    watch,
    workers,
)
from tests.support import eventually

LIMITS = ResourceLimits(cpus=0.5, memory_mb=256, pids=32)
MB = 1024 * 1024

PROBE = """#!/bin/sh
PY={python}
OUT={results}/$SUZUMIO_ACTIVATION_ID.txt
$PY -c 'b = b"x" * (768 << 20)' 2>/dev/null; echo "big=$?" > $OUT.part
$PY -c 'b = b"x" * (16 << 20)'; echo "small=$?" >> $OUT.part
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
' >> $OUT.part
sed "s/^/cgroup=/" /proc/self/cgroup >> $OUT.part
mv $OUT.part $OUT
exit 0
"""


def with_profile(plan: LaunchPlan, **profile: object) -> LaunchPlan:
    return replace(plan, profile=RuntimeProfileSpec(backend=Backend.POOL, **profile))  # type: ignore[arg-type]


@pytest.fixture
def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The in-process worker's cold runners are the probe; returns where they report."""
    results = tmp_path / "results"
    results.mkdir()
    script = tmp_path / "bin" / "python"
    script.parent.mkdir()
    script.write_text(PROBE.format(python=sys.executable, results=results))
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(script))
    return results


@contextlib.asynccontextmanager
async def in_process_worker(
    nats_url: str, namespace: str, workdir: Path, **options: object
) -> AsyncIterator[Worker]:
    config = WorkerConfig(
        nats_url=nats_url,
        namespace=namespace,
        workdir=workdir,
        heartbeat_seconds=0.2,
        kill_grace_seconds=1,
        drain_seconds=1,
        warm_runners=False,
        **options,  # type: ignore[arg-type]
    )
    worker = Worker(config)
    stop = asyncio.Event()
    serving = asyncio.create_task(worker.run(stop))
    try:
        yield worker
    finally:
        stop.set()
        await asyncio.wait_for(serving, 30)


def facts_of(path: Path) -> dict[str, list[str]]:
    facts: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition("=")
        facts.setdefault(key, []).append(value)
    return facts


async def probed(pool: PoolBackend, plan: LaunchPlan, results: Path) -> dict[str, list[str]]:
    handle = await pool.launch(plan)
    end = await watch(pool, handle, timeout=60)
    assert end.code == 0, end
    return facts_of(results / f"{plan.activation_id}.txt")


@pytest.mark.parametrize("cgroups", [True, False], ids=["cgroup", "rlimits"])
async def test_a_runs_commands_are_held_to_the_profiles_limits(
    backend: PoolBackend,  # noqa: F811
    nats_url: str,
    tmp_path: Path,
    probe: Path,
    cgroups: bool,
) -> None:
    plan = with_profile(make_plan("http://127.0.0.1:9", tmp_path / "plans"), limits=LIMITS)
    worker_id = f"lim{'c' if cgroups else 'r'}"
    async with in_process_worker(
        nats_url, backend.topology.namespace, tmp_path / "work", worker_id=worker_id,
        cgroups=cgroups,
    ) as worker:  # fmt: skip
        await wait_workers(backend, worker.cfg.worker_id)
        facts = await probed(backend, plan, probe)
        unlimited = await probed(
            backend, make_plan("http://127.0.0.1:9", tmp_path / "plans"), probe
        )
        found = worker._cgroups
        if cgroups:
            assert found is not None
            await eventually(
                lambda: asyncio.sleep(0, found.sandboxes()), lambda n: n == [], what="removed"
            )

    assert facts["big"] != ["0"], facts  # 768 MB of a 256 MB profile
    assert facts["small"] == ["0"], facts
    if cgroups:
        assert 0 < int(facts["forked"][0]) < 32, facts
        assert any(
            f"{CGROUP_PREFIX}{worker_id}-" in line and "/run-" in line for line in facts["cgroup"]
        ), facts
        assert found is not None
        assert not any(p.exists() for p in found.parents.values()), "the worker's tree stayed"
    else:
        assert found is None
    # The profile's defaults (1 GB, 512 processes) let the same commands through.
    assert unlimited["big"] == ["0"], unlimited
    assert int(unlimited["forked"][0]) == 60, unlimited


async def test_a_warm_session_is_dropped_after_the_profiles_idle_seconds(
    backend: PoolBackend,  # noqa: F811
    nats_url: str,
    tmp_path: Path,
    probe: Path,
) -> None:
    """The worker keeps sessions warm 10 minutes; a profile that says 1 s has its session's
    workspace dropped then, while another profile's session stays warm."""
    plans = tmp_path / "plans"
    short = with_profile(
        make_plan("x", plans, session_id="short"), timeouts=Timeouts(idle_seconds=1)
    )
    kept = with_profile(
        make_plan("x", plans, session_id="kept"), timeouts=Timeouts(idle_seconds=600)
    )
    async with in_process_worker(
        nats_url, backend.topology.namespace, tmp_path / "work", worker_id="idle",
        idle_ttl_seconds=600.0,
    ) as worker:  # fmt: skip
        await wait_workers(backend, "idle")
        for plan in (short, kept):
            await probed(backend, plan, probe)
        sessions = worker.root / "sessions"
        assert (sessions / "kept").is_dir()
        await eventually(
            lambda: asyncio.sleep(0, (sessions / "short").exists()),
            lambda exists: not exists,
            timeout=15,
            what="the short-lived session's workspace dropped",
        )
        await asyncio.sleep(1.5)  # several sweeps later
        assert (sessions / "kept").is_dir()
        assert len(worker.warm) == 1


async def worker_cgroups(worker_id: str) -> sandbox_limits.Cgroups:
    """The cgroups of the worker process with this id (its tree's name ends in a random
    part), found beside one made and removed here."""
    probe = sandbox_limits.discover(f"suzumio-test-{new_id()[-8:]}")
    assert isinstance(probe, sandbox_limits.Cgroups), f"this host has cgroups to use: {probe}"
    probe.close()

    def trees() -> dict[str, list[Path]]:
        pattern = f"{CGROUP_PREFIX}{worker_id}-*"
        return {c: list(p.parent.glob(pattern)) for c, p in probe.parents.items()}

    found = await eventually(
        lambda: asyncio.to_thread(trees),
        lambda found: all(len(t) == 1 for t in found.values()),
        what="the worker's cgroups",
    )
    return sandbox_limits.Cgroups(probe.version, {c: t[0] for c, t in found.items()})


def members(cgroup: Path) -> list[str]:
    """The command lines of the processes in a cgroup."""
    found = []
    for pid in (cgroup / "cgroup.procs").read_text().split():
        with contextlib.suppress(OSError):
            found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
    return found


async def test_forked_and_resident_runners_are_in_a_cgroup_of_their_own(
    backend: PoolBackend,  # noqa: F811
    workers: StartWorker,  # noqa: F811
    tmp_path: Path,
    hanging: tuple[str, Hanging],  # noqa: F811
) -> None:
    """A real worker with its fork server: the runner (waiting on a broker that never answers)
    sits in the run's cgroup with the profile's memory limit, a warm session's resident runner
    in one of its own; each cgroup goes when its runner does."""
    url, broker = hanging
    workers("forks", idle_ttl=60)
    await wait_workers(backend, "forks")
    found = await worker_cgroups("forks")

    async def runs_in(session: str) -> str:
        plan = with_profile(make_plan(url, tmp_path / "plans", session_id=session), limits=LIMITS)
        opened = broker.open
        handle = await backend.launch(plan)
        await eventually(
            lambda: asyncio.sleep(0, broker.open > opened), bool, what="the runner waiting"
        )
        [name] = found.sandboxes()
        cgroup = found.parents["memory"] / name
        assert int((cgroup / "memory.limit_in_bytes").read_text()) == LIMITS.memory_mb * MB
        assert any("suzumio.runner" in line for line in members(cgroup)), members(cgroup)
        await backend.cancel(handle)
        await watch(backend, handle, timeout=15)
        await eventually(lambda: asyncio.sleep(0, found.sandboxes()), lambda n: n == [])
        return name

    backend.settings = backend.settings.model_copy(update={"session_affinity": False})
    assert (await runs_in("s1")).startswith("run-")
    backend.settings = backend.settings.model_copy(update={"session_affinity": True})
    assert (await runs_in("warm")).startswith("resident-")


async def test_a_warm_sessions_next_activation_with_other_limits_gets_a_new_runner(
    backend: PoolBackend,  # noqa: F811
    workers: StartWorker,  # noqa: F811
    tmp_path: Path,
    fenced_url: str,  # noqa: F811
) -> None:
    """A resident runner keeps the limits it started with: the session's next activation
    with the same runs on it, one with others on a new runner in a new cgroup."""
    workers("residents", idle_ttl=60)
    await wait_workers(backend, "residents")
    found = await worker_cgroups("residents")

    async def run(limits: ResourceLimits) -> list[str]:
        plan = make_plan(fenced_url, tmp_path / "plans", session_id="w")
        end = await watch(backend, await backend.launch(with_profile(plan, limits=limits)))
        assert end.code == 6, end  # the broker refused it: an end that keeps the runner
        return await eventually(
            lambda: asyncio.sleep(0, found.sandboxes()), lambda n: len(n) == 1, what="one"
        )

    first = await run(LIMITS)
    assert await run(LIMITS) == first
    more = LIMITS.model_copy(update={"memory_mb": 300})
    other = await run(more)
    assert other != first
    limit = found.parents["memory"] / other[0] / "memory.limit_in_bytes"
    assert int(limit.read_text()) == 300 * MB


async def test_a_worker_sweeps_the_cgroups_of_workers_gone_and_no_live_ones(
    backend: PoolBackend,  # noqa: F811
    nats_url: str,
    tmp_path: Path,
) -> None:
    """A worker killed outright leaves its (empty) cgroups; the next worker on the host
    removes them — and leaves alone those of a worker that still runs, which are empty too
    between making a run's cgroup and the runner joining it."""
    me = os.getpid()
    dead = sandbox_limits.discover(f"{CGROUP_PREFIX}gone-{2**22 + 1}-1")
    live = sandbox_limits.discover(f"{CGROUP_PREFIX}live-{me}-{_started(me)}")
    assert isinstance(dead, sandbox_limits.Cgroups), dead
    assert isinstance(live, sandbox_limits.Cgroups), live
    dead.create("run-left", LIMITS)
    live.create("run-joining", LIMITS)
    try:
        async with in_process_worker(
            nats_url, backend.topology.namespace, tmp_path / "work", worker_id="sweeper"
        ):
            await wait_workers(backend, "sweeper")
            assert not any(p.exists() for p in dead.parents.values())
            assert live.sandboxes() == ["run-joining"]
    finally:
        live.close()
        dead.close()


async def test_a_run_killed_at_its_memory_limit_ends_out_of_memory(
    backend: PoolBackend,  # noqa: F811
    nats_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernel kills the runner at its cgroup's memory limit: the worker says so (`oom`),
    and the attempt ends out of memory — not retried, as a plain kill would be."""
    script = tmp_path / "bin" / "python"
    script.parent.mkdir()
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'b = b\"x\" * (768 << 20)'\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(script))
    plan = with_profile(make_plan("http://127.0.0.1:9", tmp_path / "plans"), limits=LIMITS)
    async with in_process_worker(
        nats_url, backend.topology.namespace, tmp_path / "work", worker_id="oom"
    ) as worker:
        await wait_workers(backend, worker.cfg.worker_id)
        handle = await backend.launch(plan)
        end = await watch(backend, handle, timeout=60)
    assert end.reason == "oom", end


async def test_a_cancel_heard_while_the_dispatch_is_claimed_starts_no_runner(
    backend: PoolBackend,  # noqa: F811
    nats_url: str,
    tmp_path: Path,
    hanging: tuple[str, Hanging],  # noqa: F811
    statuses: Statuses,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The claim is the last wait before a runner starts: a cancel that comes during it must
    stop the run there — not be recorded for a dispatch no longer looked at, the runner
    starting all the same."""
    url, broker = hanging
    claiming, go_on = asyncio.Event(), asyncio.Event()
    claim = Worker._claim

    async def slow_claim(self: Worker, dispatch: object) -> object:
        claiming.set()
        await go_on.wait()  # NATS slow to answer
        return await claim(self, dispatch)  # type: ignore[arg-type]

    monkeypatch.setattr(Worker, "_claim", slow_claim)
    async with in_process_worker(
        nats_url, backend.topology.namespace, tmp_path / "work", worker_id="claimer"
    ) as worker:
        await wait_workers(backend, worker.cfg.worker_id)
        handle = await backend.launch(make_plan(url, tmp_path / "plans"))
        watching = asyncio.create_task(watch(backend, handle, timeout=60))
        await asyncio.wait_for(claiming.wait(), 30)
        await backend.cancel(handle)
        await asyncio.sleep(0.5)  # the cancel reaches the worker while it claims
        go_on.set()
        end = await watching
        for _ in range(200):  # the run is over (at most 20 s)
            if not worker._runs:
                break
            await asyncio.sleep(0.1)
        assert not worker._runs
    assert end.reason == "cancelled", end
    assert not statuses.of(handle.sandbox_id, "started"), statuses.of(handle.sandbox_id)
    assert broker.open == 0  # no runner of it called the broker


async def test_a_resident_runner_killed_after_an_earlier_activations_oom_is_not_out_of_memory(
    backend: PoolBackend,  # noqa: F811
    workers: StartWorker,  # noqa: F811
    tmp_path: Path,
    fenced_url: str,  # noqa: F811
    hanging: tuple[str, Hanging],  # noqa: F811
) -> None:
    """A warm session's resident runner keeps its cgroup, whose count of kills at the memory
    limit spans its activations: one of an earlier activation's processes killed there does
    not make a later activation whose runner is killed (here by hand) end out of memory."""
    url, broker = hanging
    workers("oomw", idle_ttl=60)
    await wait_workers(backend, "oomw")
    found = await worker_cgroups("oomw")

    def plan(broker_url: str) -> LaunchPlan:
        made = make_plan(broker_url, tmp_path / "plans", session_id="w")
        return with_profile(made, limits=LIMITS)

    first = await watch(backend, await backend.launch(plan(fenced_url)))
    assert first.code == 6, first  # the broker refused it: an end that keeps the runner
    [name] = found.sandboxes()
    cgroup = found.parents["memory"] / name
    greedy = await asyncio.create_subprocess_exec(
        "/bin/sh", "-c",
        f"echo $$ > {cgroup}/cgroup.procs && exec {sys.executable} -c 'b = b\"x\" * (768 << 20)'",
    )  # fmt: skip
    assert await greedy.wait() == -9  # killed at the limit, as a command of the first one
    assert found.oom_kills(name) == 1

    opened = broker.open
    second = await backend.launch(plan(url))
    await eventually(lambda: asyncio.sleep(0, broker.open > opened), bool, what="waiting")
    [runner] = [
        int(pid)
        for pid in (cgroup / "cgroup.procs").read_text().split()
        if b"suzumio.runner" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    os.kill(runner, signal.SIGKILL)
    end = await watch(backend, second)
    assert end.reason == "killed", end  # as a plain kill is (retried), not out of memory


class StuckCopy:
    """The worker's copying of a dispatch's inputs never ends (a large file, a slow store)."""

    def __init__(self) -> None:
        self.copying = asyncio.Event()
        self.copies = 0
        self.claims = 0

    async def bring_in(self, *args: object) -> None:  # noqa: ARG002
        self.copies += 1
        self.copying.set()
        await asyncio.Event().wait()


@pytest_asyncio.fixture
async def stuck_copy(monkeypatch: pytest.MonkeyPatch, nc: NATS, topology: Topology) -> StuckCopy:
    await ensure_object_store(nc.jetstream(), topology.bucket(ARTIFACTS_BUCKET))
    stuck = StuckCopy()
    monkeypatch.setattr(exchange, "bring_in", stuck.bring_in)  # as the worker calls it
    claim = Worker._claim

    async def counted_claim(self: Worker, dispatch: object) -> object:
        stuck.claims += 1
        return await claim(self, dispatch)  # type: ignore[arg-type]

    monkeypatch.setattr(Worker, "_claim", counted_claim)
    return stuck


def with_input(plan: LaunchPlan) -> LaunchPlan:
    return replace(plan, inputs=(FileRef(path="big.bin", sha256="ab" * 32, size=1 << 30),))


@contextlib.asynccontextmanager
async def copying(
    backend: PoolBackend,  # noqa: F811
    nats_url: str, workdir: Path, worker_id: str, broker_url: str,
    stuck: StuckCopy,
) -> AsyncIterator[tuple[Worker, Handle]]:  # fmt: skip
    """A worker in this process, and a dispatch launched on it whose files are coming in."""
    namespace = backend.topology.namespace
    async with in_process_worker(nats_url, namespace, workdir, worker_id=worker_id) as worker:
        await wait_workers(backend, worker_id)
        handle = await backend.launch(with_input(make_plan(broker_url, workdir.parent / "plans")))
        await asyncio.wait_for(stuck.copying.wait(), 30)
        yield worker, handle


async def test_a_cancel_ends_a_run_whose_files_are_still_coming_in(
    backend: PoolBackend,  # noqa: F811
    nats_url: str,
    tmp_path: Path,
    hanging: tuple[str, Hanging],  # noqa: F811
    statuses: Statuses,  # noqa: F811
    stuck_copy: StuckCopy,
) -> None:
    """The copy is given up at the cancel, the dispatch never claimed nor its runner started:
    it went on copying, and the activation stayed `running` until the copy was done."""
    url, broker = hanging
    work = tmp_path / "work"
    async with copying(backend, nats_url, work, "copier", url, stuck_copy) as (worker, handle):
        watching = asyncio.create_task(watch(backend, handle, timeout=30))
        await backend.cancel(handle)
        end = await watching
        await eventually(lambda: asyncio.sleep(0, not worker._runs), bool, what="run over")
    # Ended by the worker at the cancel ("killed") or by the backend before it heard of a start
    assert end.reason in {"cancelled", "killed"}, end
    assert "cancelled" in (end.detail or ""), end
    assert stuck_copy.claims == 1  # claimed (as before), but never started
    assert not statuses.of(handle.sandbox_id, "started"), statuses.of(handle.sandbox_id)
    assert broker.open == 0


async def test_a_worker_stopping_while_a_runs_files_come_in_hands_the_dispatch_back(
    backend: PoolBackend,  # noqa: F811
    nats_url: str,
    tmp_path: Path,
    hanging: tuple[str, Hanging],  # noqa: F811
    statuses: Statuses,  # noqa: F811
    stuck_copy: StuckCopy,
) -> None:
    """Unclaimed and not started, for the next worker to run: the drain did not wait for the
    copy, which went on after the worker stopped, the dispatch held by nobody until its ack
    wait ran out."""
    url, _ = hanging
    work = tmp_path / "work"
    async with copying(backend, nats_url, work, "leaver", url, stuck_copy) as (worker, handle):
        pass  # stopped while its run's files come in
    assert not worker._runs  # nothing left behind it
    assert stuck_copy.claims == 0
    assert not statuses.of(handle.sandbox_id), statuses.of(handle.sandbox_id)
    async with in_process_worker(
        nats_url, backend.topology.namespace, tmp_path / "work2", worker_id="taker"
    ) as taker:
        await wait_workers(backend, taker.cfg.worker_id)
        await eventually(lambda: asyncio.sleep(0, stuck_copy.copies == 2), bool, what="taken")
        assert taker._runs  # copying its files now
    assert stuck_copy.claims == 0
