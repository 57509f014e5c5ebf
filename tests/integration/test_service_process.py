"""Every service runs as its own process: ready against real servers, drained by SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from suzumio.contracts.subjects import Topology
from suzumio.platform.service.runtime import resolve_endpoints
from suzumio.platform.settings import ServiceSettings
from suzumio.testing.processes import ServiceProcess, http_status
from tests.support import cpu_policies, policy_for

SERVICES = ("session", "scheduler", "orchestrator", "toolbroker", "gateway")


async def test_each_service_becomes_ready_and_drains_on_sigterm(
    nats_url: str,
    database_url: str,
    topology: Topology,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SUZUMIO_CPU_POLICY", raising=False)  # the default, whatever the shell
    data_dir = tmp_path / "data"
    env = {"SUZUMIO_DATA_DIR": str(data_dir)}
    procs = [
        ServiceProcess(name, nats_url, database_url, topology, tmp_path / f"{name}.log", env)
        for name in SERVICES
    ]
    for proc in procs:
        proc.start()
    try:
        await asyncio.gather(*(p.wait_ready() for p in procs))
        for proc in procs:
            assert await http_status(proc.port, "/healthz") == 200
            assert await http_status(proc.port, "/metrics") == 200
            assert proc.process is not None
            # The platform's CPU policy by default, on every thread (docs/operations.md).
            assert cpu_policies(proc.process.pid) == {policy_for("batch")}, proc.name
        results = await asyncio.gather(*(p.terminate() for p in procs))
    finally:
        for proc in procs:
            if proc.process and proc.process.poll() is None:
                proc.kill()

    for proc, (code, seconds) in zip(procs, results, strict=True):
        assert code == 0, proc.log_path.read_text()[-3000:]
        assert seconds < 10
        assert '"service.stopped"' in proc.log_path.read_text()
    # With URLs configured, nothing embedded was started in the data directory.
    assert not (data_dir / "nats").exists()
    assert not (data_dir / "postgres").exists()


async def test_sigterm_turns_readiness_off_then_exits_cleanly(
    nats_url: str, database_url: str, topology: Topology, tmp_path: Path
) -> None:
    """A draining service stops saying it is ready at once, so load balancers stop sending."""
    proc = ServiceProcess("session", nats_url, database_url, topology, tmp_path / "s.log").start()
    try:
        await proc.wait_ready()
        assert proc.process is not None
        started = time.monotonic()
        proc.process.send_signal(signal.SIGTERM)
        assert await http_status_after_term(proc.port) in {503, None}
        code = await asyncio.to_thread(proc.process.wait, 15)
    finally:
        if proc.process and proc.process.poll() is None:
            proc.kill()
    assert code == 0
    assert time.monotonic() - started < 10


async def test_a_service_told_to_inherit_its_cpu_policy_keeps_it(
    nats_url: str, database_url: str, topology: Topology, tmp_path: Path
) -> None:
    env = {"SUZUMIO_CPU_POLICY": "INHERIT"}  # any case, as the other choices
    proc = ServiceProcess("session", nats_url, database_url, topology, tmp_path / "s.log", env)
    proc.start()
    try:
        await proc.wait_ready()
        assert proc.process is not None
        assert cpu_policies(proc.process.pid) == {policy_for("inherit")}
    finally:
        await proc.terminate()


async def test_an_unknown_cpu_policy_stops_the_service_at_start_naming_it(
    nats_url: str, database_url: str, topology: Topology, tmp_path: Path
) -> None:
    env = {"SUZUMIO_CPU_POLICY": "fastest"}
    log = tmp_path / "s.log"
    proc = ServiceProcess("session", nats_url, database_url, topology, log, env).start()
    assert proc.process is not None
    try:
        code = await asyncio.to_thread(proc.process.wait, 30)
    finally:
        if proc.process.poll() is None:  # it started after all: the test fails, leaving nothing
            proc.kill()
    assert code != 0
    text = log.read_text()
    assert "cpu_policy" in text, text[-2000:]
    assert "'batch' or 'inherit'" in text, text[-2000:]


async def http_status_after_term(port: int) -> int | None:
    await asyncio.sleep(0.05)
    return await http_status(port, "/readyz")


@pytest.mark.parametrize("missing", ["SUZUMIO_NATS_URL", "SUZUMIO_DATABASE_URL"])
def test_without_urls_the_data_directorys_embedded_servers_are_used(
    missing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nats_url: str, postgres_url: str
) -> None:
    monkeypatch.setenv("SUZUMIO_NATS_URL", nats_url)
    monkeypatch.setenv("SUZUMIO_DATABASE_URL", postgres_url)
    monkeypatch.delenv(missing)
    monkeypatch.setenv("SUZUMIO_DATA_DIR", str(tmp_path))
    nats, db, servers = resolve_endpoints(ServiceSettings())
    try:
        assert servers is not None
        started = servers.nats if missing == "SUZUMIO_NATS_URL" else servers.postgres
        assert started is not None
        assert started.owned
        assert (nats, db) == (
            (started.url, postgres_url)
            if missing == "SUZUMIO_NATS_URL"
            else (nats_url, started.url)
        )
        # A second process finds and borrows the same server instead of starting another.
        again = resolve_endpoints(ServiceSettings())
        assert again[:2] == (nats, db)
        assert again[2] is not None
        assert not (again[2].nats or again[2].postgres).owned  # type: ignore[union-attr]
    finally:
        if servers is not None:
            servers.stop()
