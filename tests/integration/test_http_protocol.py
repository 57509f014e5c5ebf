"""The services' HTTP protocol (uvicorn's httptools parser with a bound on a request's head),
behind a real uvicorn server: a head past 16 KiB is answered 431 before the application sees
it, however it comes (one long header, a header that never ends, many short ones), while
heads under it and bodies of any size the app allows go through, request after request on
one connection."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from suzumio.platform.service.http_protocol import MAX_HEAD_BYTES, BoundedHttpToolsProtocol

SEEN: list[str] = []


async def echo(request: Request) -> JSONResponse:
    SEEN.append(request.url.path)
    body = await request.body()
    return JSONResponse({"size": len(body), "pad": len(request.headers.get("x-pad", ""))})


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[tuple[str, int]]:
    app = Starlette(routes=[Route("/echo", echo, methods=["GET", "POST"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, http=BoundedHttpToolsProtocol, log_config=None, lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        yield "127.0.0.1", sock.getsockname()[1]
    finally:
        server.should_exit = True
        await task


async def _raw(host: str, port: int, pieces: list[bytes]) -> bytes:
    """Write `pieces` one by one (each its own read on the server) while reading the answer;
    what was read when the server closed."""
    reader, writer = await asyncio.open_connection(host, port)
    answer = asyncio.create_task(reader.read(300))
    try:
        for piece in pieces:
            if answer.done():
                break
            writer.write(piece)
            try:
                await writer.drain()
            except ConnectionError:
                break
            await asyncio.sleep(0.001)
        return await asyncio.wait_for(answer, 10)
    finally:
        writer.close()


@pytest.mark.parametrize(
    "pieces",
    [
        # one long header, sent whole
        [b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 1_000_000 + b"\r\n\r\n"],
        # a header that never ends, in reads of 4 KiB: httptools would gather it for ever
        [b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Big: "] + [b"a" * 4096] * 64,
        # many short headers
        [b"GET /echo HTTP/1.1\r\nHost: x\r\n" + b"X-Many: b\r\n" * 20_000 + b"\r\n"],
        # a request line past the bound
        [b"GET /echo?" + b"q" * (MAX_HEAD_BYTES + 10) + b" HTTP/1.1\r\nHost: x\r\n\r\n"],
    ],
    ids=["long-header", "endless-header", "many-headers", "long-url"],
)
async def test_a_head_past_the_bound_is_answered_431_before_the_app(pieces: list[bytes]) -> None:
    SEEN.clear()
    async with serving() as (host, port):
        answer = await _raw(host, port, pieces)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:100]
        assert SEEN == []
        # The server goes on for everyone else.
        async with httpx.AsyncClient() as client:
            fine = await client.get(f"http://{host}:{port}/echo")
        assert fine.json() == {"size": 0, "pad": 0}


async def test_trailers_that_never_end_are_answered_431() -> None:
    """A chunked body's trailers are parsed as headers, an unfinished one gathered across
    reads: bounded as a head is, though the request reached the application already."""
    head = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    async with serving() as (host, port):
        answer = await _raw(host, port, [head, b"3\r\nabc\r\n0\r\nX-T: "] + [b"a" * 4096] * 64)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:100]
        async with httpx.AsyncClient() as client:
            fine = await client.get(f"http://{host}:{port}/echo")
        assert fine.json() == {"size": 0, "pad": 0}


async def test_heads_under_the_bound_and_large_bodies_pass_on_one_connection() -> None:
    """The body is not the head: 1 MiB of it in the same reads as a head near the bound is
    read by the app, and so are the next requests on the kept connection."""
    pad = "p" * (MAX_HEAD_BYTES - 1024)
    async with serving() as (host, port), httpx.AsyncClient() as client:
        url = f"http://{host}:{port}/echo"
        for size in (0, 1 << 20, 10, 1 << 20):
            answer = await client.post(url, content=b"x" * size, headers={"x-pad": pad})
            assert answer.json() == {"size": size, "pad": len(pad)}
        # A chunked body in many small reads, with trailers under the bound.
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(300):  # 300 reads of 100 bytes each: more than the bound, all body
            writer.write(b"64\r\n" + b"z" * 100 + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.001)
        writer.write(b"0\r\nX-T: " + b"t" * 8000 + b"\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200 "), head
        writer.close()
        # Pipelined: two whole requests in one write, each answered.
        reader, writer = await asyncio.open_connection(host, port)
        one = f"GET /echo HTTP/1.1\r\nHost: x\r\nX-Pad: {pad}\r\n\r\n".encode()
        writer.write(one + one)
        seen = b""
        while seen.count(b"HTTP/1.1 200 ") < 2:
            chunk = await asyncio.wait_for(reader.read(65536), 10)
            assert chunk, seen
            seen += chunk
        writer.close()
