"""A pool worker's health endpoint (`--health-port`, docs/pool.md), probed over HTTP as a
kubelet would: the worker a real process on real NATS — the session's server, or one of the
test's own that it kills and starts again (`RestartableNats`, as the NATS fault test does)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from suzumio.contracts.subjects import Topology
from suzumio.platform.bus import connection
from suzumio.platform.bus.jsapi import ensure_streams
from suzumio.runner.health import HEALTHZ, MAX_LINE, READ_TIMEOUT_SECONDS, READYZ
from suzumio.testing import servers
from tests.fault.test_nats_restart import RestartableNats
from tests.support import eventually, start_pool_worker

Answer = tuple[int, dict[str, Any]]


def records(log: Path) -> list[dict[str, Any]]:
    found = []
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            found.append(json.loads(line))
    return found


class ProbedWorker:
    """`python -m suzumio.runner worker --health-port 0` and the port it says it took."""

    def __init__(self, nats_url: str, namespace: str, tmp_path: Path, *options: str) -> None:
        self.log = tmp_path / "worker.log"
        self.proc = start_pool_worker(
            nats_url, namespace, tmp_path / "w", self.log, "--health-port", "0", *options
        )
        self.port = 0

    async def started(self) -> None:
        def serving() -> int:
            ports = [r["port"] for r in records(self.log) if r["event"] == "worker.health_serving"]
            assert self.proc.poll() is None, self.log.read_text()
            return int(ports[0]) if ports else 0

        self.port = await eventually(
            lambda: asyncio.sleep(0, serving()), bool, timeout=60, what="the health endpoint"
        )

    async def get(self, path: str) -> Answer:
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.get(f"http://127.0.0.1:{self.port}{path}")
        return response.status_code, response.json()

    async def until(self, path: str, status: int, timeout: float = 60) -> Answer:
        return await eventually(
            lambda: self.get(path),
            lambda answer: answer[0] == status,
            timeout=timeout,
            what=f"{path} answering {status}",
        )

    async def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.to_thread(self.proc.wait, 60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return await asyncio.to_thread(self.proc.wait)


@pytest_asyncio.fixture
async def worker(nats_url: str, topology: Topology, tmp_path: Path) -> AsyncIterator[ProbedWorker]:
    async with await connection.connect(nats_url, "health-test") as client:
        await ensure_streams(client, topology.streams())
    probed = ProbedWorker(nats_url, topology.namespace, tmp_path)
    try:
        await probed.started()
        yield probed
    finally:
        assert await probed.stop() == 0


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[RestartableNats]:
    server = RestartableNats(tmp_path / "nats")
    try:
        yield server
    finally:
        server.stop()


async def test_ready_once_connected_and_unknown_paths_are_404(worker: ProbedWorker) -> None:
    assert await worker.until(READYZ, 200) == (200, {"status": "ok"})
    assert await worker.get(HEALTHZ) == (200, {"status": "ok"})
    for path in ("/", "/health", f"{READYZ}/x", "/metrics"):
        assert (await worker.get(path))[0] == 404
    async with httpx.AsyncClient(timeout=10) as client:
        posted = await client.post(f"http://127.0.0.1:{worker.port}{READYZ}")
        head = await client.head(f"http://127.0.0.1:{worker.port}{HEALTHZ}?verbose=1")
    assert posted.status_code == 405
    assert (head.status_code, head.content) == (200, b"")


async def test_not_ready_while_nats_is_away_but_alive_all_along(
    own_nats: RestartableNats, tmp_path: Path
) -> None:
    topology = servers.fresh_topology()
    async with await connection.connect(own_nats.url, "health-test") as client:
        await ensure_streams(client, topology.streams())
    probed = ProbedWorker(own_nats.url, topology.namespace, tmp_path, "--cold")
    try:
        await probed.started()
        await probed.until(READYZ, 200)
        own_nats.kill()
        _, body = await probed.until(READYZ, 503)
        assert body == {"status": "unavailable", "reason": "not connected to NATS"}
        assert await probed.get(HEALTHZ) == (200, {"status": "ok"})  # a restart would not help
        await asyncio.sleep(2)
        assert (await probed.get(READYZ))[0] == 503
        assert (await probed.get(HEALTHZ))[0] == 200
        own_nats.start_again()
        await probed.until(READYZ, 200)  # reconnected, its consumer bound again
        assert (await probed.get(HEALTHZ))[0] == 200
    finally:
        assert await probed.stop() == 0


async def test_a_worker_waiting_for_nats_is_alive_and_not_ready(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nowhere = f"nats://127.0.0.1:{s.getsockname()[1]}"  # closed once the block ends
    probed = ProbedWorker(nowhere, "t", tmp_path)
    try:
        await probed.started()
        assert await probed.get(HEALTHZ) == (200, {"status": "ok"})
        assert await probed.get(READYZ) == (
            503,
            {"status": "unavailable", "reason": "not connected to NATS"},
        )
    finally:
        assert await probed.stop() == 0


async def test_an_endless_header_line_is_cut_off_and_the_worker_goes_on(
    worker: ProbedWorker,
) -> None:
    await worker.until(READYZ, 200)
    reader, writer = await asyncio.open_connection("127.0.0.1", worker.port)
    writer.write(f"GET {HEALTHZ} HTTP/1.1\r\nHost: x\r\nX-Endless: ".encode())
    sent, answer = 0, b""
    with contextlib.suppress(ConnectionError):
        async with asyncio.timeout(30):
            while not reader.at_eof() and sent < 200 * MAX_LINE:
                writer.write(b"a" * 4096)
                await writer.drain()
                sent += 4096
                with contextlib.suppress(TimeoutError):
                    answer += await asyncio.wait_for(reader.read(1024), 0.01)
    writer.close()
    assert sent < 200 * MAX_LINE, "the endless line was read on and on"
    assert answer == b"" or answer.startswith(b"HTTP/1.1 431 "), answer
    assert await worker.get(HEALTHZ) == (200, {"status": "ok"})
    assert (await worker.get(READYZ))[0] == 200
    assert worker.proc.poll() is None


async def test_a_client_that_never_ends_its_request_is_cut_off(worker: ProbedWorker) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", worker.port)
    writer.write(f"GET {HEALTHZ} HTTP/1.1\r\nHost: x\r\n".encode())  # and no blank line
    await writer.drain()
    assert await worker.get(HEALTHZ) == (200, {"status": "ok"})  # others are answered meanwhile
    async with asyncio.timeout(READ_TIMEOUT_SECONDS + 20):
        answer = await reader.read()  # until the worker closes it
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer


async def test_a_dead_fork_server_is_not_ready_until_it_is_started_again(
    worker: ProbedWorker,
) -> None:
    await worker.until(READYZ, 200)
    [forks] = [pid for pid in children(worker.proc.pid) if b"forkserver" in cmdline(pid)]
    os.kill(forks, signal.SIGKILL)
    _, body = await worker.until(READYZ, 503)
    assert body["reason"] == "the fork server is down"
    assert (await worker.get(HEALTHZ))[0] == 200
    await worker.until(READYZ, 200)  # started again within a heartbeat, with no activation
    assert "worker.forkserver_restarted" in [r["event"] for r in records(worker.log)]


async def test_a_health_port_taken_ends_the_worker_with_a_reason(
    nats_url: str, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        log = tmp_path / "worker.log"
        proc = start_pool_worker(nats_url, "t", tmp_path / "w", log, "--health-port", port)
        try:
            code = await asyncio.to_thread(proc.wait, 60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert code == 1
    last = records(log)[-1]
    assert last["event"] == "worker.stopped"
    assert last["reason"].startswith(f"cannot serve health on 127.0.0.1:{port}: ")


def children(pid: int) -> list[int]:
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                # after the command's closing parenthesis: state, then the parent's pid
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def cmdline(pid: int) -> bytes:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    return b""
