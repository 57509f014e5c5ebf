"""A model endpoint that answers and then sends only SSE keep-alive comments (a gateway whose
upstream hung): the SDK's read timeout is per read and every comment reset it, so the call
held the activation until its wall clock ran out, no retry, no fallback. With no chunk for
as long as the read timeout it ends as a transport failure (a TimeoutError), which the loop
retries.

The endpoint is a stand-in HTTP server on loopback (the model provider: the one allowed
fake), called through the real openai SDK."""

from __future__ import annotations

import asyncio
import contextlib

from suzumio.contracts.values import ModelSpec
from suzumio.runner.model import Endpoint, ModelClient

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(HEAD)
        while True:  # comments only, never a chunk
            writer.write(chunk(b": PROCESSING\n\n"))
            await writer.drain()
            await asyncio.sleep(0.05)


async def test_a_stream_of_keepalives_only_ends_the_call() -> None:
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    model = ModelClient(
        ModelSpec(name="m"), Endpoint(f"http://127.0.0.1:{port}/v1", "k"), timeout=0.5
    )
    try:
        call = asyncio.create_task(model.complete([{"role": "user", "content": "hi"}], [], 16))
        done, _ = await asyncio.wait({call}, timeout=20)  # a bound on the test, not the claim
        if not done:
            call.cancel()
        assert done, "the call went on for as long as the keep-alives came"
        assert isinstance(call.exception(), TimeoutError)
    finally:
        await model.close()
        server.close()
