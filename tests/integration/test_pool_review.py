"""The pool worker and its fork server under what a review found them to mishandle: an agent
that made its `out/` unreadable or a directory in it read-only, a worker stopped with such a
workspace, a Ctrl-C that reaches the worker's whole process group, and a fork server whose
answers hold a line that is not one, is slow to warm up, or dies before it is warm.

Permissions only bind an unprivileged user: where the tests run as root, the worker runs as
`nobody` (in a work directory of its own) so that what an agent does to its files counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from suzumio.contracts.subjects import ARTIFACTS_BUCKET, Topology
from suzumio.orchestrator.backends.base import LaunchPlan
from suzumio.orchestrator.backends.pool import PoolBackend
from suzumio.platform.bus.kv import ensure_object_store
from suzumio.runner import forkserver
from suzumio.runner.forkserver import ForkServer
from suzumio.runner.workfiles import empty
from tests.integration.test_pool_backend import (
    SETTINGS,
    Hanging,
    eventually,
    make_plan,
    refuse,
    wait_workers,
    watch,
)
from tests.integration.test_worker_remove_tree import NOBODY, as_unprivileged, unprivileged_dir

ROOT = os.geteuid() == 0


def owned_by_the_agent(*paths: Path) -> None:
    """As if the worker's user (the agent's) had made them."""
    if ROOT:
        for path in paths:
            os.chown(path, NOBODY, NOBODY, follow_symlinks=False)


@pytest.fixture
def workdir() -> Iterator[Path]:
    """Where the workers keep their runs: the worker's user's (`nobody` under root)."""
    with unprivileged_dir() as base:
        yield base


StartWorker = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def workers(nats_url: str, topology: Topology, workdir: Path) -> Iterator[StartWorker]:
    """Workers as an unprivileged user, each the leader of a process group of its own (as a
    worker started from a terminal is)."""
    started: list[subprocess.Popen[bytes]] = []

    def start(worker_id: str, *extra: str, idle_ttl: float = 0) -> subprocess.Popen[bytes]:
        log = workdir.parent / f"{workdir.name}-{worker_id}.log"
        unprivileged: dict[str, Any] = (
            {"user": NOBODY, "group": NOBODY, "extra_groups": []} if ROOT else {}
        )
        with log.open("wb") as out:
            proc: subprocess.Popen[bytes] = subprocess.Popen(
                [sys.executable, "-m", "suzumio.runner", "worker", "--nats", nats_url,
                 "--namespace", topology.namespace, "--workdir", str(workdir),
                 "--worker-id", worker_id, "--heartbeat", "0.3", "--kill-grace", "1",
                 "--drain", "1", "--idle-ttl", str(idle_ttl), *extra],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **unprivileged,
            )  # fmt: skip
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in started:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
    for log in workdir.parent.glob(f"{workdir.name}-*.log"):
        log.unlink()


@pytest_asyncio.fixture
async def backend(nc: NATS, topology: Topology) -> AsyncIterator[PoolBackend]:
    await ensure_object_store(nc.jetstream(), topology.bucket(ARTIFACTS_BUCKET))
    created = PoolBackend(nc, topology, SETTINGS)
    yield created
    await created.close()


@pytest_asyncio.fixture
async def fenced_url() -> AsyncIterator[str]:
    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    server.close()


@pytest_asyncio.fixture
async def hanging() -> AsyncIterator[tuple[str, Hanging]]:
    state = Hanging()
    server = await asyncio.start_server(state.handle, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", state
    server.close()


def with_outputs(plan: LaunchPlan) -> LaunchPlan:
    return replace(plan, max_output_files=10, max_output_bytes=1_000_000)


# -- what an agent does to its `out/` ------------------------------------------------------
def test_emptying_out_survives_an_unreadable_or_read_only_directory() -> None:
    with unprivileged_dir() as base:

        def make_and_empty() -> bool:
            out = base / "out"
            sealed = out / "sub"
            sealed.mkdir(parents=True)
            (sealed / "a.txt").write_text("a report")
            (out / "b.txt").write_text("another")
            sealed.chmod(0o555)  # `chmod -R a-w`, as `go build` leaves its module cache
            empty(out)
            if any(out.iterdir()):
                return False
            (out / "c.txt").write_text("one more")
            out.chmod(0o300)  # `chmod 300 out`: nothing in it can be listed
            empty(out)
            return out.is_dir() and not any(out.iterdir())

        assert as_unprivileged(make_and_empty)


async def test_an_out_directory_made_unreadable_does_not_lose_the_end_of_its_run(
    backend: PoolBackend, workers: StartWorker, workdir: Path, tmp_path: Path,
    hanging: tuple[str, Hanging], fenced_url: str,
) -> None:  # fmt: skip
    """The run's end is reported (and its dispatch acked), not lost for want of emptying its
    `out/`; and the session's next run there ends as it ends too."""
    url, broker = hanging
    workers("wa", idle_ttl=30)
    await wait_workers(backend, "wa")
    handle = await backend.launch(with_outputs(make_plan(url, tmp_path, session_id="s1")))
    await eventually(lambda: broker.open > 0)
    out = workdir / "wa" / "sessions" / "s1" / "out"
    out.chmod(0o300)  # as the agent would have

    await backend.cancel(handle)
    result = await watch(backend, handle, timeout=15)

    assert (result.code, result.reason) == (9, "killed"), result
    assert result.detail.startswith("cancelled")
    again = await backend.launch(with_outputs(make_plan(fenced_url, tmp_path, session_id="s1")))
    after = await watch(backend, again)
    assert (after.code, after.reason) == (6, "exited"), after


async def test_outputs_in_a_read_only_directory_are_not_handed_in_again_by_the_next_run(
    backend: PoolBackend, workers: StartWorker, workdir: Path, tmp_path: Path,
    hanging: tuple[str, Hanging], fenced_url: str,
) -> None:  # fmt: skip
    url, broker = hanging
    workers("wa", idle_ttl=30)
    await wait_workers(backend, "wa")
    handle = await backend.launch(with_outputs(make_plan(url, tmp_path, session_id="s1")))
    await eventually(lambda: broker.open > 0)
    sealed = workdir / "wa" / "sessions" / "s1" / "out" / "sub"
    sealed.mkdir()
    (sealed / "a.txt").write_text("the agent's report")
    owned_by_the_agent(sealed, sealed / "a.txt")
    sealed.chmod(0o555)
    await backend.cancel(handle)
    first = await watch(backend, handle, timeout=15)
    assert [ref.path for ref in first.outputs] == ["sub/a.txt"]

    after = await backend.launch(with_outputs(make_plan(fenced_url, tmp_path, session_id="s1")))
    second = await watch(backend, after)

    assert (second.code, second.outputs) == (6, ())  # not the first run's file once more


# -- stopping ------------------------------------------------------------------------------
async def test_a_stopped_worker_removes_its_warm_workspaces_though_made_read_only(
    backend: PoolBackend, workers: StartWorker, workdir: Path, tmp_path: Path, fenced_url: str
) -> None:
    worker = workers("wa", idle_ttl=30)
    await wait_workers(backend, "wa")
    handle = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
    assert (await watch(backend, handle)).code == 6
    cache = workdir / "wa" / "sessions" / "s1" / "go" / "pkg" / "mod"
    cache.mkdir(parents=True)
    (cache / "go.mod").write_text("module m")
    owned_by_the_agent(cache.parent.parent, cache.parent, cache, cache / "go.mod")
    for directory in (cache, cache.parent, cache.parent.parent):
        directory.chmod(0o555)

    worker.send_signal(signal.SIGTERM)

    assert await asyncio.to_thread(worker.wait, 15) == 0
    assert not (workdir / "wa").exists()  # a new worker has a new id: nobody else would


async def test_a_ctrl_c_to_the_workers_process_group_drains_its_runs(
    backend: PoolBackend, workers: StartWorker, tmp_path: Path, hanging: tuple[str, Hanging]
) -> None:
    """A terminal's Ctrl-C reaches the worker and its fork server alike: the worker drains,
    and the fork server (whose end ends every runner) lives until it is done."""
    url, broker = hanging
    worker = workers("wa")
    await wait_workers(backend, "wa")
    handle = await backend.launch(make_plan(url, tmp_path))
    await eventually(lambda: broker.open > 0)

    os.killpg(worker.pid, signal.SIGINT)
    result = await watch(backend, handle, timeout=15)

    assert (result.code, result.reason) == (9, "killed"), result  # stopped by the drain
    assert result.detail.startswith("shutdown")
    assert await asyncio.to_thread(worker.wait, 15) == 0


# -- the fork server's answers ---------------------------------------------------------------
FAKE_SERVER = r"""
import json, sys
def ask():
    return json.loads(sys.stdin.readline())["id"]
def say(line):
    sys.stdout.write(line + "\n"); sys.stdout.flush()
say(json.dumps({"id": ask(), "pid": 4242}))
for garbage in ("not json", "[1]", '"text"', '{"no": "id"}', '{"id": [1]}'):
    say(garbage)
say(json.dumps({"pid": 4242, "code": 3}))
say(json.dumps({"id": ask(), "pid": 4243}))
sys.stdin.readline()  # dies when asked anything more (or when its stdin closes)
"""


class FakeForkServer(ForkServer):
    """The worker's side against a server that answers with lines that are not answers too,
    then dies with a runner still running (it never says it is warm: not waited for)."""

    async def start(self, ready_within: float = 0) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", FAKE_SERVER,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        self._reader = asyncio.create_task(self._read())


async def test_a_line_from_the_fork_server_that_is_no_answer_does_not_hang_every_run() -> None:
    server = FakeForkServer()
    await server.start()
    try:
        first = await server.spawn(Path("input.json"), Path(), Path("runner.log"), {})
        assert await asyncio.wait_for(first.wait(), 5) == 3  # its exit, after the garbage
        second = await server.spawn(Path("input.json"), Path(), Path("runner.log"), {})
        assert server._proc is not None
        assert server._proc.stdin is not None
        server._proc.stdin.write(b"{}\n")  # the server dies: its runner died with it
        assert await asyncio.wait_for(second.wait(), 5) == -int(signal.SIGKILL)
    finally:
        await server.close()


async def test_a_fork_server_whose_reading_failed_still_ends_every_wait(
    tmp_path: Path,
) -> None:
    """Whatever stops the reading of its answers, no run waits on for an end that nobody
    will report (its dispatch held, heartbeat after heartbeat, for ever)."""
    server = FakeForkServer()
    await server.start()
    try:
        first = await server.spawn(Path("input.json"), tmp_path, tmp_path / "runner.log", {})
        assert await asyncio.wait_for(first.wait(), 5) == 3
        second = await server.spawn(Path("input.json"), tmp_path, tmp_path / "runner.log", {})
        assert server._reader is not None
        server._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await server._reader
        assert not server.alive  # the worker starts another for the next run
        assert await asyncio.wait_for(second.wait(), 5) == -int(signal.SIGKILL)
    finally:
        await server.close()


async def test_a_resident_runs_request_of_many_megabytes_does_not_stall_the_fork_server(
    tmp_path: Path,
) -> None:
    """A session's history makes its resident run's request a line of megabytes: the fork
    server (single-threaded: every start and end of the worker's runners waits on it) reads
    it in a moment, not in time that grows with the square of its size (16 s for 32 MB)."""
    server = ForkServer()
    await server.start()
    try:
        env = {"PATH": "/usr/bin:/bin"}
        resident = await server.spawn_resident(tmp_path, tmp_path / "runner.log", env, 3)
        began = time.monotonic()
        run = await server.run_in(resident, "x" * (32 << 20), tmp_path, env)
        code = await asyncio.wait_for(run.wait(), 60)
        took = time.monotonic() - began
    finally:
        await server.close()
    assert code == 2  # not an input: the runner said so at once
    assert took < 5, f"{took:.1f} s"


async def test_a_resident_runners_end_of_an_activation_comes_before_its_exit(
    tmp_path: Path,
) -> None:
    """The worker reads a resident runner's replies itself, and hears of its exit from the
    server: an activation it ended and then left (its last run) ends with the code it
    reported, never the runner's exit code; one it did not end, with the runner's."""
    server = ForkServer()
    await server.start()
    try:
        env = {"PATH": "/usr/bin:/bin"}
        for i in range(5):
            resident = await server.spawn_resident(tmp_path, tmp_path / f"r{i}.log", env, 1)
            run = await server.run_in(resident, "not an input", tmp_path, env)
            assert await asyncio.wait_for(run.wait(), 60) == 2  # what it said, not its exit 0
            assert await asyncio.wait_for(resident.wait(), 60) == 0
            with pytest.raises(OSError, match="has ended"):
                await server.run_in(resident, "not an input", tmp_path, env)
        resident = await server.spawn_resident(tmp_path, tmp_path / "killed.log", env, 3)
        os.kill(resident.pid, signal.SIGSTOP)  # it cannot answer before it is killed
        run = await server.run_in(resident, "not an input", tmp_path, env)
        os.kill(resident.pid, signal.SIGKILL)
        assert await asyncio.wait_for(run.wait(), 60) == -int(signal.SIGKILL)
        assert server._runs == {}
        assert server._residents == {}
    finally:
        await server.close()


async def test_a_request_json_cannot_hold_fails_as_a_start_and_leaves_nothing_waiting(
    tmp_path: Path,
) -> None:
    """A value orjson cannot encode (a lone surrogate: a worker path that is not UTF-8, read
    back by Python) fails that start or run as the server being unreachable does — an
    `OSError` the worker handles — and leaves no run or start waiting for an answer; the
    server serves on."""
    server = ForkServer()
    await server.start()
    try:
        env = {"PATH": "/usr/bin:/bin"}
        bad = {**env, "HOME": "/tmp/\udcff"}
        with pytest.raises(OSError, match="cannot be encoded"):
            await server.spawn_resident(tmp_path, tmp_path / "r0.log", bad, 3)
        resident = await server.spawn_resident(tmp_path, tmp_path / "runner.log", env, 3)
        with pytest.raises(OSError, match="cannot be encoded"):
            await server.run_in(resident, "{}", tmp_path, bad)
        assert server._runs == {}
        assert server._pending == {}
        run = await server.run_in(resident, "not an input", tmp_path, env)
        assert await asyncio.wait_for(run.wait(), 60) == 2  # the runner said so: it serves on
    finally:
        await server.close()


async def test_a_start_the_fork_server_names_too_late_is_killed_not_left_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start that waited too long for the server's answer failed (the attempt is retried):
    the process the server then starts after all must not run on beside the retry."""
    monkeypatch.setattr(forkserver, "FORK_ANSWER_SECONDS", 0.5)
    server = ForkServer()
    await server.start()
    assert server._proc is not None
    pid = server._proc.pid
    try:
        env = {"PATH": "/usr/bin:/bin"}
        os.kill(pid, signal.SIGSTOP)  # busy elsewhere, as far as this start can tell
        try:
            with pytest.raises(TimeoutError):
                await server.spawn_resident(tmp_path, tmp_path / "runner.log", env, 3)
        finally:
            os.kill(pid, signal.SIGCONT)

        def children() -> list[psutil.Process]:
            alive = []
            for child in psutil.Process(pid).children():
                # The one started late is killed as this looks: gone between the two reads.
                with contextlib.suppress(psutil.NoSuchProcess):
                    if child.status() != psutil.STATUS_ZOMBIE:
                        alive.append(child)
            return alive

        # The server goes on, and starts it after all; then this one (answered in order).
        resident = await server.spawn_resident(tmp_path, tmp_path / "runner2.log", env, 3)
        assert resident.returncode is None  # the server serves on
        await eventually(lambda: [c.pid for c in children()] == [resident.pid], timeout=10)
    finally:
        await server.close()


SLOW_TO_WARM_SERVER = """
import json, sys, time
time.sleep(1.0)  # the imports and the warm-up of a real one
open(sys.argv[1], "w").close()
def say(line):
    sys.stdout.write(line + "\\n"); sys.stdout.flush()
say(json.dumps({"ready": True}))
say(json.dumps({"id": json.loads(sys.stdin.readline())["id"], "pid": 4242}))
sys.stdin.readline()
"""


class ScriptedForkServer(ForkServer):
    """The worker's side against a stand-in server (a script, not the runner's)."""

    def __init__(self, *argv: str) -> None:
        super().__init__()
        self._argv = list(argv)

    def _command(self) -> list[str]:
        return [sys.executable, *self._argv]


async def test_a_fork_server_is_waited_for_until_it_is_warm(tmp_path: Path) -> None:
    """The worker pulls only after `start`: a server still importing would hold the first
    dispatch it took for seconds, where another worker could have started it at once."""
    warm = tmp_path / "warm"
    server = ScriptedForkServer("-c", SLOW_TO_WARM_SERVER, str(warm))
    try:
        await asyncio.wait_for(server.start(), 30)
        assert warm.exists()  # started returned after the warm-up, not at the exec
        assert server.ready
        assert server.alive
        child = await server.spawn(Path("input.json"), tmp_path, tmp_path / "runner.log", {})
        assert child.pid == 4242
    finally:
        await server.close()


async def test_a_fork_server_that_dies_while_warming_up_does_not_hold_the_worker() -> None:
    server = ScriptedForkServer("-c", "import sys; sys.exit(3)")
    try:
        await asyncio.wait_for(server.start(ready_within=600), 30)
        assert not server.ready
        assert not server.alive  # the worker starts another
    finally:
        await server.close()


async def test_the_runners_fork_server_says_when_it_is_warm(tmp_path: Path) -> None:
    server = ForkServer()
    try:
        await asyncio.wait_for(server.start(), 120)
        assert server.ready
        env = {"PATH": "/usr/bin:/bin"}
        resident = await server.spawn_resident(tmp_path, tmp_path / "runner.log", env, 1)
        run = await server.run_in(resident, "not an input", tmp_path, env)
        assert await asyncio.wait_for(run.wait(), 60) == 2
    finally:
        await server.close()


async def test_the_fork_server_holds_none_of_the_workers_nats_credentials(
    nats_url: str, topology: Topology, backend: PoolBackend, tmp_path: Path
) -> None:
    """A runner's commands run as the worker's user and can find their runner's parent, the
    fork server: its environment must not hold the worker's NATS URL, credentials and all
    (with them, a sandbox could read every dispatch of the pool: others' tokens and keys)."""
    env = {**os.environ, "SUZUMIO_NATS_URL": nats_url}
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "suzumio.runner", "worker", "--namespace", topology.namespace,
         "--workdir", str(tmp_path / "work"), "--worker-id", "envy", "--heartbeat", "0.3"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    try:
        await wait_workers(backend, "envy")  # it reached NATS through the variable
        [server] = [c for c in psutil.Process(worker.pid).children() if "forkserver" in c.cmdline()]
        held = Path(f"/proc/{server.pid}/environ").read_bytes().split(b"\0")
        assert not [v for v in held if v.startswith(b"SUZUMIO_")]
        assert not [v for v in held if nats_url.encode() in v]
        assert any(v.startswith(b"PATH=") for v in held)  # the rest is the worker's
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=15)
        log.close()
