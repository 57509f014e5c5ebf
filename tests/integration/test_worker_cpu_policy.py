"""A pool worker runs under the platform's CPU policy (SCHED_BATCH unless told to inherit),
and its fork server — the parent of every runner it starts — takes it from the worker. A
policy it does not know stops it at start with a message. Real NATS, the worker a process."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from pathlib import Path

import psutil
import pytest

from suzumio.contracts.subjects import Topology
from tests.support import cpu_policies, eventually, policy_for, start_pool_worker


async def policies_of_worker_and_fork_server(proc: subprocess.Popen[bytes]) -> list[set[int]]:
    async def fork_server() -> list[psutil.Process]:
        found = []
        for child in psutil.Process(proc.pid).children():
            with contextlib.suppress(psutil.Error):  # one that ended meanwhile
                if "forkserver" in " ".join(child.cmdline()):
                    found.append(child)
        return found

    try:
        (server,) = await eventually(fork_server, bool, timeout=30, what="the fork server")
        return [cpu_policies(proc.pid), cpu_policies(server.pid)]
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 30)


@pytest.mark.parametrize(
    ("options", "policy"),
    [((), "batch"), (("--cpu-policy", "Inherit"), "inherit")],
)
async def test_the_worker_and_its_fork_server_run_under_the_cpu_policy(
    nats_url: str,
    topology: Topology,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    options: tuple[str, ...],
    policy: str,
) -> None:
    monkeypatch.delenv("SUZUMIO_CPU_POLICY", raising=False)  # the default, whatever the shell
    proc = start_pool_worker(
        nats_url, topology.namespace, tmp_path / "w", tmp_path / "worker.log", *options
    )
    expected = policy_for(policy)
    assert await policies_of_worker_and_fork_server(proc) == [{expected}, {expected}]


async def test_the_policy_comes_from_the_environment_as_the_services_take_it(
    nats_url: str, topology: Topology, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUZUMIO_CPU_POLICY", "Inherit")
    proc = start_pool_worker(nats_url, topology.namespace, tmp_path / "w", tmp_path / "w.log")
    assert await policies_of_worker_and_fork_server(proc) == [{policy_for("inherit")}] * 2


@pytest.mark.parametrize(
    ("variable", "options", "said"),
    [
        ("fastest", (), "SUZUMIO_CPU_POLICY must be batch or inherit, not 'fastest'"),
        ("batch", ("--cpu-policy", "fast"), "--cpu-policy must be batch or inherit, not 'fast'"),
    ],
)
async def test_an_unknown_policy_stops_the_worker_at_start_naming_where_it_came_from(
    nats_url: str,
    topology: Topology,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    options: tuple[str, ...],
    said: str,
) -> None:
    monkeypatch.setenv("SUZUMIO_CPU_POLICY", variable)
    log = tmp_path / "w.log"
    proc = start_pool_worker(nats_url, topology.namespace, tmp_path / "w", log, *options)
    try:
        code = await asyncio.to_thread(proc.wait, 30)
    finally:
        if proc.poll() is None:  # it started after all: the test fails, leaving nothing
            proc.kill()
            proc.wait()
    assert code == 2
    assert said in log.read_text()
