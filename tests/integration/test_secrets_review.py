"""Secrets stay out of a service's log on the paths real servers take (DESIGN.md §10).

The service runtime's own HTTP server (uvicorn as `ServiceRuntime.serve` configures it) logs
every WebSocket handshake with its query string, where browsers put `?access_token=`; a NATS
URL carries the embedded server's token, and the error of a connect that gave up names it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import InvalidStatus

from suzumio.contracts.subjects import Topology
from suzumio.platform.bus import connection
from suzumio.platform.embedded import start_nats
from suzumio.platform.logging import get_logger
from tests.support import configure_logging_uncached as configure_logging
from tests.support import serving

# What a person might paste as a key: not every secret has a shape we know.
ACCESS_TOKEN = "opaque-Access-Token-4f1c9b2e7d"  # noqa: S105 - a test value


async def _refuse(websocket: WebSocket) -> None:
    await websocket.close(code=1008)  # before accepting: a 403 handshake, as a bad key gets


async def _accept(websocket: WebSocket) -> None:
    await websocket.accept()
    await websocket.close()


async def test_a_websocket_access_token_is_not_in_the_service_log(
    json_logs: pytest.CaptureFixture[str],
    tmp_path: Path,
    nats_url: str,
    database_url: str,
    topology: Topology,
) -> None:
    configure_logging("probe", fmt="json")  # here: the captured stderr is the test's now
    app = Starlette(routes=[WebSocketRoute("/refuse", _refuse), WebSocketRoute("/ok", _accept)])
    async with serving(app, tmp_path, nats_url, database_url, topology) as port:
        base = f"ws://127.0.0.1:{port}"
        for attempt in range(100):  # until uvicorn listens
            try:
                async with ws_connect(f"{base}/ok?access_token={ACCESS_TOKEN}&x=1") as ws:
                    await ws.wait_closed()
                break
            except OSError:
                assert attempt < 99
                await asyncio.sleep(0.05)
        with pytest.raises(InvalidStatus):
            async with ws_connect(f"{base}/refuse?access_token={ACCESS_TOKEN}"):
                pass
    err = json_logs.readouterr().err
    handshakes = [line for line in err.splitlines() if "WebSocket /" in line]
    assert len(handshakes) == 2, err  # the handshakes are logged, their paths with them ...
    assert all("access_token=<redacted>" in line for line in handshakes), handshakes
    assert ACCESS_TOKEN not in err  # ... but not the key


async def test_a_nats_token_in_a_connect_error_is_not_logged(
    json_logs: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    configure_logging("probe", fmt="json")
    server = start_nats(tmp_path / "nats", monitoring=False)
    url = server.url
    token = urlsplit(url).username
    assert token
    assert len(token) > 20
    server.stop()  # nothing answers there now
    with pytest.raises(connection.NatsUnreachableError) as caught:
        await connection.connect(url, "probe", first_connect_within=0.5)
    assert token in str(caught.value)  # the error names the URL, as the CLI expects
    log = get_logger("probe")
    log.warning("nats.unreachable", error=str(caught.value))
    log.warning("nats.unreachable", error=caught.value)  # shown by its repr
    try:
        raise caught.value
    except connection.NatsUnreachableError:
        log.exception("nats.unreachable")
        logging.getLogger("lib").exception("connect to %s failed", url)
    lines = [json.loads(line) for line in json_logs.readouterr().err.splitlines() if line]
    assert len(lines) == 4
    assert token not in json.dumps(lines)
    assert "nats://<redacted>@127.0.0.1" in lines[0]["error"]
