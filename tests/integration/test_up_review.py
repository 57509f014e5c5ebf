"""What `suzumio up` stands on, under failure: a service told to stop while it still waits for
NATS, the embedded Postgres with a lost password file, an embedded server that dies, a NATS
server restarted under running services."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import psutil
import pytest
from nats.js.errors import NotFoundError

from suzumio.contracts.subjects import Topology
from suzumio.platform.embedded import EmbeddedServers, start_nats, start_postgres
from suzumio.platform.embedded.postgres_auth import PASSWORD_FILE
from suzumio.platform.embedded.process import free_port
from suzumio.platform.errors import EmbeddedServerError
from suzumio.platform.service import runtime as runtime_module
from suzumio.platform.service.runtime import ServiceRuntime
from suzumio.platform.settings import ServiceSettings


def _clean_env(**more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUZUMIO_")}
    return env | {"SUZUMIO_LOG_FORMAT": "json", **more}


async def test_a_service_stopped_while_it_waits_for_nats_exits(tmp_path: Path) -> None:
    """NATS is waited for as long as it takes; SIGTERM still ends the wait, and cleanly."""
    with (tmp_path / "scheduler.log").open("wb") as log:
        service = subprocess.Popen(
            [sys.executable, "-m", "suzumio.scheduler"],
            env=_clean_env(
                SUZUMIO_NATS_URL=f"nats://127.0.0.1:{free_port()}",  # nobody listens there
                SUZUMIO_DATABASE_URL=f"postgresql://x:y@127.0.0.1:{free_port()}/x",
                SUZUMIO_DATA_DIR=str(tmp_path / "data"),
                SUZUMIO_HTTP_PORT=str(free_port()),
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while b"nats.error" not in (tmp_path / "scheduler.log").read_bytes():
            assert service.poll() is None
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        service.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(service.wait, 10)
    finally:
        if service.poll() is None:
            service.kill()
            service.wait()
    assert code == 0, (tmp_path / "scheduler.log").read_text()[-3000:]


async def _database_answers(url: str) -> None:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        assert await conn.fetchval("SELECT 1") == 1
    finally:
        await conn.close()


async def test_a_password_file_lost_in_a_crash_is_set_again(tmp_path: Path) -> None:
    """A crash can leave the new password file empty (written, renamed, never flushed); the
    next start must not invent a password the server never heard of."""
    pgdata = tmp_path / "postgres"
    server = start_postgres(pgdata, durable=False)
    try:
        await _database_answers(server.url)
    finally:
        server.stop()
    (pgdata / PASSWORD_FILE).write_text("")

    again = start_postgres(pgdata, durable=False)
    try:
        await _database_answers(again.url)
    finally:
        again.stop()

    (pgdata / PASSWORD_FILE).unlink()  # lost altogether
    third = start_postgres(pgdata, durable=False)
    try:
        await _database_answers(third.url)
    finally:
        third.stop()


def _nats_servers_of(store_dir: Path) -> list[psutil.Process]:
    conf = str(store_dir.resolve() / "nats-server.conf")
    return [
        child
        for child in psutil.Process().children()
        if child.is_running() and child.status() != psutil.STATUS_ZOMBIE
        if conf in child.cmdline()
    ]


def test_a_failed_start_leaves_no_half_of_the_pair_running(tmp_path: Path) -> None:
    """NATS started, then Postgres could not: the NATS server is stopped, not left behind."""
    data = tmp_path / "data"
    (data / "postgres").mkdir(parents=True)
    (data / "postgres" / "stray").write_text("no Postgres data directory")
    servers = EmbeddedServers(data, durable=False)
    with pytest.raises(EmbeddedServerError, match="no PG_VERSION"):
        servers.ensure()
    assert _nats_servers_of(data / "nats") == []
    assert not (data / "embedded.json").exists()


async def test_a_dead_embedded_server_is_started_again_at_its_address(tmp_path: Path) -> None:
    """What `suzumio up` does when one dies: the same URL works again, nobody reconfigured."""
    import nats  # noqa: PLC0415

    servers = EmbeddedServers(tmp_path / "data", durable=False).ensure()
    try:
        assert servers.nats is not None
        assert servers.postgres is not None
        assert servers.gone() == []
        nats_url, db_url = servers.nats.url, servers.postgres.url
        for server in (servers.nats, servers.postgres):
            assert server.process is not None
            server.process.kill()
            server.process.wait()
        assert {s.name for s in servers.gone()} == {"nats", "postgres"}
        for server in servers.gone():
            servers.restart(server)
        assert servers.gone() == []
        assert (servers.nats.url, servers.postgres.url) == (nats_url, db_url)
        nc = await nats.connect(nats_url)
        await nc.close()
        await _database_answers(db_url)
    finally:
        servers.stop()
    assert not (tmp_path / "data" / "embedded.json").exists()


async def test_streams_lost_with_a_nats_restart_are_made_again(
    tmp_path: Path, database_url: str, topology: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LIVE is a memory stream: a restarted NATS server comes back without it. Every service
    made the streams only at start, so each `/readyz` said not ready from then on, for good."""
    monkeypatch.setattr(runtime_module, "STREAMS_RECHECK_SECONDS", 0.2)
    port = free_port()
    server = start_nats(tmp_path / "nats", port=port, monitoring=False)
    settings = ServiceSettings(namespace=topology.namespace, data_dir=tmp_path / "data")
    runtime = ServiceRuntime("probe", settings, nats_url=server.url, database_url=database_url)
    stop = asyncio.Event()
    serving: asyncio.Task[None] | None = None
    try:
        await runtime.open()
        serving = asyncio.create_task(runtime.serve(None, stop))
        _, report = await runtime.readiness.check()
        assert report["checks"]["streams"] is True

        server.stop()
        server = start_nats(tmp_path / "nats", port=port, monitoring=False)
        deadline = time.monotonic() + 20
        while True:
            _, report = await runtime.readiness.check()
            if report["checks"]["streams"] is True:
                break
            assert time.monotonic() < deadline, report
            await asyncio.sleep(0.2)
    finally:
        stop.set()
        if serving is not None:
            await serving
        await runtime.close()
        server.stop()


async def test_a_lost_file_stream_is_not_made_again_empty(
    tmp_path: Path, database_url: str, topology: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The event log gone is data lost (or not recovered yet): an empty EVENTS in its place
    would pass for the log, so only memory streams are made again; readiness says so."""
    monkeypatch.setattr(runtime_module, "STREAMS_RECHECK_SECONDS", 0.1)
    server = start_nats(tmp_path / "nats", port=free_port(), monitoring=False)
    settings = ServiceSettings(namespace=topology.namespace, data_dir=tmp_path / "data")
    runtime = ServiceRuntime("probe", settings, nats_url=server.url, database_url=database_url)
    stop = asyncio.Event()
    serving: asyncio.Task[None] | None = None
    try:
        await runtime.open()
        serving = asyncio.create_task(runtime.serve(None, stop))
        js = runtime.nc.jetstream()
        await js.delete_stream(topology.events_stream)
        await js.delete_stream(topology.live_stream)
        deadline = time.monotonic() + 20
        while True:  # LIVE comes back ...
            try:
                await js.stream_info(topology.live_stream)
                break
            except NotFoundError:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # ... and EVENTS, several rounds later, still does not
        with pytest.raises(NotFoundError):
            await js.stream_info(topology.events_stream)
        _, report = await runtime.readiness.check()
        assert report["checks"]["streams"] is False
    finally:
        stop.set()
        if serving is not None:
            await serving
        await runtime.close()
        server.stop()
