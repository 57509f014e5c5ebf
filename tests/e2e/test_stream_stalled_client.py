"""An SSE client that keeps its connection open and reads nothing is let go: the server's write
waited for room in the socket with no end of its own, holding the stream's feed, its queues
and consumer, and the user's stream slot for good."""

from __future__ import annotations

import asyncio
import contextlib
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


async def test_a_client_that_stops_reading_is_let_go(strict_stack: Stack) -> None:
    stack = strict_stack
    world = await new_world(stack, "sloth")
    api = urlsplit(stack.api)
    reader, writer = await asyncio.open_connection(api.hostname, api.port)
    try:
        writer.write(
            f"GET /v1/sessions/{world.session_id}/stream HTTP/1.1\r\n"
            f"Host: {api.netloc}\r\nAuthorization: Bearer {world.key}\r\n\r\n".encode()
        )
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200")
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
