"""A stream client (SSE or WebSocket) that keeps its connection open and reads nothing is let
go: the server's write waited for room in the socket with no end of its own, holding the
stream's feed, its queues and consumer, and the user's stream slot for good."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import pytest_asyncio

from tests.e2e.api import new_world, publish_chunk
from tests.e2e.stack import Stack, running_stack
from tests.support import eventually

WRITE_TIMEOUT = 2


@pytest_asyncio.fixture
async def strict_stack(
    nats_url: str, postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    """One stream per user, and a short write timeout."""
    tmp = Path(tmp_path_factory.mktemp("stalled"))
    env = {
        "SUZUMIO_STREAM_WRITE_TIMEOUT_SECONDS": str(WRITE_TIMEOUT),
        "SUZUMIO_STREAM_MAX_PER_USER": "1",
    }
    async with running_stack(nats_url, postgres_url, tmp, extra_env=env) as s:
        yield s


async def _stream_status(stack: Stack, key: str, session_id: str) -> int:
    async with (
        stack.client(key) as c,
        c.stream("GET", f"/v1/sessions/{session_id}/stream") as response,
    ):
        return response.status_code


STREAM_REQUESTS = {
    "sse": "GET /v1/sessions/{session}/stream HTTP/1.1\r\nHost: {host}\r\n"
    "Authorization: Bearer {key}\r\n\r\n",
    "websocket": "GET /v1/sessions/{session}/ws HTTP/1.1\r\nHost: {host}\r\n"
    "Authorization: Bearer {key}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: {nonce}\r\nSec-WebSocket-Version: 13\r\n\r\n",
}
STREAM_HEADS = {"sse": b"HTTP/1.1 200", "websocket": b"HTTP/1.1 101"}


@pytest.mark.parametrize("transport", ["sse", "websocket"])
async def test_a_client_that_stops_reading_is_let_go(strict_stack: Stack, transport: str) -> None:
    stack = strict_stack
    world = await new_world(stack, "sloth")
    api = urlsplit(stack.api)
    reader, writer = await asyncio.open_connection(api.hostname, api.port)
    try:
        request = STREAM_REQUESTS[transport].format(
            session=world.session_id,
            host=api.netloc,
            key=world.key,
            nonce=base64.b64encode(os.urandom(16)).decode(),
        )
        writer.write(request.encode())
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(STREAM_HEADS[transport])
        # Its one stream is open: another is refused.
        assert await _stream_status(stack, world.key, world.session_id) == 429
        # Far more live output than the sockets between hold; the client reads none of it.
        for _ in range(600):
            await publish_chunk(stack, world, "x" * 50_000)
        # Let go within the write timeout (and the feed's close): its slot is free again.
        await eventually(
            lambda: _stream_status(stack, world.key, world.session_id),
            lambda status: status == 200,
            timeout=WRITE_TIMEOUT + 20,
            what="the stalled stream's slot",
        )
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
