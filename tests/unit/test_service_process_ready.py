"""The test harness's readiness wait knows its own service from a stranger on the same port."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from suzumio.contracts.subjects import Topology
from suzumio.testing.processes import ServiceProcess


async def _answer_ready_as(service: str) -> asyncio.Server:
    body = b'{"service": "%s", "ready": true}' % service.encode()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0)


@pytest.mark.parametrize(("answering", "accepted"), [("gateway", True), ("session", False)])
async def test_wait_ready_accepts_only_its_own_service(
    tmp_path: Path, answering: str, accepted: bool
) -> None:
    server = await _answer_ready_as(answering)
    port = server.sockets[0].getsockname()[1]
    # A process that lost the port to the server above: alive, never serving.
    loser = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    proc = ServiceProcess(
        "gateway", "nats://unused", "postgresql://unused", Topology(), tmp_path / "log", port=port
    )
    proc.process = loser
    (tmp_path / "log").write_text("")
    try:
        if accepted:
            await proc.wait_ready(timeout=5)
        else:
            with pytest.raises(AssertionError, match="served by 'session', not gateway"):
                await proc.wait_ready(timeout=5)
    finally:
        loser.kill()
        loser.wait()
        server.close()
        await server.wait_closed()
