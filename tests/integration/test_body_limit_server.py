"""The body limit behind a real HTTP server (uvicorn with the services' protocol): a client
that writes its whole body before it reads the answer, as httpx does, gets the 413 when the
body is megabytes over the limit (closing with the body unread would reset the connection and
lose the answer)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from suzumio.platform.service import BodyLimit, BodyLimits
from suzumio.platform.service.http_protocol import BoundedHttpToolsProtocol

LIMIT = 64 * 1024
OVER = 8 << 20  # far more than the sockets' buffers hold: the client is still writing


async def size(request: Request) -> JSONResponse:
    return JSONResponse({"size": len(await request.body())})


async def test_a_client_writing_a_body_over_the_limit_reads_the_413() -> None:
    app = BodyLimit(Starlette(routes=[Route("/up", size, methods=["PUT"])]), BodyLimits(LIMIT))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, http=BoundedHttpToolsProtocol, log_config=None, lifespan="off")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/up"

    async def body() -> AsyncIterator[bytes]:
        for _ in range(OVER // 65536):
            yield b"x" * 65536

    try:
        while not server.started:
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(timeout=30) as client:
            refused = await client.put(url, content=body(), headers={"Content-Length": str(OVER)})
            assert refused.status_code == 413
            assert refused.json()["code"] == "too_large"
            fine = await client.put(url, content=b"y" * LIMIT)  # and the client goes on
            assert fine.json() == {"size": LIMIT}
    finally:
        server.should_exit = True
        await serving
