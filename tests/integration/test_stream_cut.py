"""A response cut on purpose after its body began (`StreamCutError`: the model relay past its
deadline, a provider's stream broken) breaks the client's connection, so the client never
takes a partial body for a whole one, and leaves no "Exception in ASGI application" traceback
in the service's log; any other exception there is still logged with its traceback. Served by
`ServiceRuntime.serve`, as every service is."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from suzumio.contracts.subjects import Topology
from suzumio.platform.service.stream_cut import StreamCutError
from tests.support import configure_logging_uncached as configure_logging
from tests.support import serving


def _streaming(path: str, error: Exception) -> Route:
    async def body() -> AsyncIterator[bytes]:
        yield b"data: first\n\n"
        await asyncio.sleep(0.05)
        raise error

    async def endpoint(_: Request) -> StreamingResponse:
        return StreamingResponse(body(), media_type="text/event-stream")

    return Route(path, endpoint)


async def _read(client: httpx.AsyncClient, path: str, chunks: list[bytes]) -> None:
    async with client.stream("GET", path) as answer:
        assert answer.status_code == 200
        async for chunk in answer.aiter_raw():
            chunks.append(chunk)


async def test_a_cut_breaks_the_stream_without_a_traceback_in_the_log(
    json_logs: pytest.CaptureFixture[str],
    tmp_path: Path,
    nats_url: str,
    database_url: str,
    topology: Topology,
) -> None:
    configure_logging("probe", fmt="json")
    cut, bug = _streaming("/cut", StreamCutError("on purpose")), _streaming("/bug", ValueError())
    app = Starlette(routes=[cut, bug])
    received: dict[str, bytes] = {}
    async with (
        serving(app, tmp_path, nats_url, database_url, topology) as port,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client,
    ):
        for attempt in range(100):  # until uvicorn listens
            try:
                await client.get("/nowhere")
                break
            except httpx.ConnectError:
                assert attempt < 99
                await asyncio.sleep(0.05)
        for path in ("/cut", "/bug"):
            chunks: list[bytes] = []
            with pytest.raises(httpx.RemoteProtocolError):  # broken, not ended
                await _read(client, path, chunks)
            received[path] = b"".join(chunks)
    assert received == {"/cut": b"data: first\n\n", "/bug": b"data: first\n\n"}
    err = json_logs.readouterr().err
    tracebacks = [line for line in err.splitlines() if "Exception in ASGI application" in line]
    assert len(tracebacks) == 1, err  # the bug's ...
    assert "ValueError" in tracebacks[0]
    assert "StreamCutError" not in err  # ... and nothing of the cut
    assert "on purpose" not in err
