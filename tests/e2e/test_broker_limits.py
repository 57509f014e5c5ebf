"""The tool-broker's bounds and its word on trouble, against the real services: bodies over
the limit are refused before they are read (no token needed to be turned away), a final call
it cannot record or a history call naming a message twice changes nothing, a live batch is
bounded by its data too, and NATS gone for a moment or the broker's appends losing races is a
503 to retry — never a refusal."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import nats.errors
import pytest

from suzumio.contracts.errors import ConflictError
from suzumio.contracts.events import SessionMessageAppended, ToolCallStarted
from suzumio.contracts.ids import new_id
from suzumio.platform.embedded.nats import start_nats
from tests.e2e.api import new_world
from tests.e2e.runner_env import request_activation
from tests.e2e.stack import Stack, running_stack
from tests.e2e.test_broker_access import (
    ORCHESTRATOR,
    activation_types,
    broker,
    live,
    mint,
    start_body,
)
from tests.support import eventually

STEP = 10.0  # bounds a wait that hangs on a regression; not a timing claim


def port_of(stack: Stack) -> int:
    return int(urlsplit(stack.url_of("toolbroker")).port or 0)


async def exchange(port: int, head: bytes) -> bytes:
    """Send `head` alone and read the answer to its end: it must come without the server
    waiting for the body it was promised. (Nothing of the body is sent: bytes the server
    leaves unread when it closes make its kernel reset the connection, which can discard
    the answer before it is read.)"""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), STEP)
    finally:
        writer.close()


def status_and_problem(answer: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"application/problem+json" in head.lower(), head
    return int(head.split()[1]), json.loads(body)


async def test_a_declared_body_over_the_limit_is_refused_before_it_is_read(
    platform: Stack,
) -> None:
    head = (
        b"POST /activation-output HTTP/1.1\r\nHost: broker\r\n"
        b"Content-Type: application/json\r\nContent-Length: 67108864\r\n\r\n"
    )
    status, problem = status_and_problem(await exchange(port_of(platform), head))
    assert (status, problem["code"]) == (413, "too_large")


async def streamed(port: int, head: bytes) -> tuple[int, bytes]:
    """A chunked body of up to 64 MiB sent after `head`, as long as no answer came: how much
    was sent, and the answer (empty: the connection was reset)."""
    chunk = b"4000\r\n" + b"x" * 16384 + b"\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answer = asyncio.create_task(reader.read())
    sent = 0
    try:
        writer.write(head)
        while not answer.done() and sent < 64 * 1024 * 1024:
            writer.write(chunk)
            await writer.drain()
            await asyncio.sleep(0)  # the reader sees the answer (or the reset) as it comes
            sent += len(chunk)
        got = await asyncio.wait_for(answer, STEP)
    except (ConnectionResetError, BrokenPipeError):
        got = b""  # refused: what it said was lost to the reset
    finally:
        writer.close()
    return sent, got


async def test_a_streamed_body_is_refused_once_it_passes_its_routes_limit(
    platform: Stack,
) -> None:
    """An audit record is small: its route takes 64 KiB. A chunked body of 64 MiB is sent:
    the broker ends the request long before its end (what was sent by then is at most what
    the sockets' buffers hold) — with a 413, or, when bytes it did not read are still
    arriving as it closes, with a reset."""
    a = await live(platform, "chunky")
    head = (
        b"POST /runner/tool-calls/start HTTP/1.1\r\nHost: broker\r\n"
        + f"Authorization: Bearer {a.token}\r\n".encode()
        + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    sent, got = await streamed(port_of(platform), head)
    assert sent < 16 * 1024 * 1024, sent  # it did not read on to the end
    if got:
        status, problem = status_and_problem(got)
        assert (status, problem["code"]) == (413, "too_large")


async def test_a_body_without_a_token_is_refused_before_any_of_it_is_read(
    platform: Stack,
) -> None:
    """FastAPI parses a route's whole body before the token's check: a stranger's 30 MB of
    JSON (within the route's bound) cost the broker seconds of its loop and hundreds of MB for
    a 401. Refused at once now: streamed, on a connection closed after the answer."""
    head = (
        b"POST /runner/signals HTTP/1.1\r\nHost: broker\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    sent, got = await streamed(port_of(platform), head)
    assert sent < 16 * 1024 * 1024, sent
    if got:
        status, problem = status_and_problem(got)
        assert (status, problem["code"]) == (401, "unauthenticated")
    # Declared and short enough to be thrown away: answered on a connection that stays open.
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port_of(platform)}") as c:
        refused = await c.post("/runner/signals", content=b"[" * 1_000_000)
        assert refused.status_code == 401, refused.text
        assert refused.json()["code"] == "unauthenticated"
        assert refused.headers.get("connection") != "close"


async def test_a_final_text_the_log_cannot_hold_is_422_and_nothing_happens(
    platform: Stack,
) -> None:
    a = await live(platform, "bigo")
    sub = await platform.nc.jetstream().subscribe(
        platform.topology.live_subject(a.world.session_id), ordered_consumer=True
    )
    body = {
        "text": "x" * 1_000_001,
        "history": [{"message_id": new_id(), "role": "assistant", "text": "done"}],
        "live": {"batch": 0, "chunks": [{"kind": "text", "text": "do"}]},
    }
    async with broker(platform, a.token) as c:
        response = await c.post("/activation-output", json=body)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    with pytest.raises(nats.errors.TimeoutError):
        await sub.next_msg(timeout=0.5)
    await sub.unsubscribe()
    assert await appended(platform, a.world.session_id) == []
    assert await activation_types(platform, a.activation_id) == []


async def test_entries_repeating_a_message_id_are_refused_whole(platform: Stack) -> None:
    a = await live(platform, "twin")
    twice = new_id()
    entries = [
        {"message_id": new_id(), "role": "assistant", "text": "first"},
        {"message_id": twice, "role": "assistant", "text": "one"},
        {"message_id": twice, "role": "tool", "text": "two", "tool_call_id": "c"},
    ]
    async with broker(platform, a.token) as c:
        history = await c.post("/runner/history", json={"entries": entries})
        final = await c.post("/activation-output", json={"text": "done", "history": entries})
    assert (history.status_code, final.status_code) == (422, 422)
    assert twice in history.json()["detail"]
    assert await appended(platform, a.world.session_id) == []
    assert await activation_types(platform, a.activation_id) == []


async def test_a_live_batchs_data_counts_against_its_bound(platform: Stack) -> None:
    """Little text, 2.1 M characters of data: refused whole, nothing published."""
    a = await live(platform, "datum")
    sub = await platform.nc.jetstream().subscribe(
        platform.topology.live_subject(a.world.session_id), ordered_consumer=True
    )
    chunks = [{"kind": "state", "text": "s", "data": {"blob": "d" * 70_000}}] * 30
    async with broker(platform, a.token) as c:
        response = await c.post("/runner/stream", json={"batch": 0, "chunks": chunks})
    assert response.status_code == 413, response.text
    with pytest.raises(nats.errors.TimeoutError):
        await sub.next_msg(timeout=0.5)
    await sub.unsubscribe()


async def test_a_live_batch_past_any_bound_is_refused_before_it_is_read(platform: Stack) -> None:
    """Larger than any batch the bound lets through, however escaped: 413 before the body is
    read or parsed — the token (none here) is checked after the body is parsed, and this
    broker would otherwise take 32 MB from anyone who can reach it."""
    body = b'{"batch": 0, "chunks": [{"kind": "text", "text": "' + b"x" * 13_000_000 + b'"}]}'
    async with broker(platform, None) as c:
        response = await c.post(
            "/runner/stream", content=body, headers={"content-type": "application/json"}
        )
    assert response.status_code == 413, response.text[:500]


async def test_nats_gone_for_a_moment_is_a_503_and_the_retry_records_once(
    postgres_url: str, tmp_path: Path
) -> None:
    """A NATS of its own, stopped under the broker: the token's check cannot read the log, so
    the call is answered 503 with Retry-After (the runner retries, never gives up on its
    output as refused); with NATS back the same call is recorded, once."""
    store = tmp_path / "nats"
    server = start_nats(store)
    port = int(urlsplit(server.url).port or 0)
    try:
        services = ("session", "toolbroker", "gateway")
        async with running_stack(server.url, postgres_url, tmp_path / "stack", services) as s:
            world = await new_world(s, "blip")
            activation_id = await request_activation(s, world)
            token = mint(s, world, activation_id)
            async with broker(s, token) as c:
                server.stop()
                down = await c.post("/runner/tool-calls/start", json=start_body())
                server = start_nats(store, port=port)
                assert down.status_code == 503, down.text
                assert down.headers["content-type"] == "application/problem+json"
                assert down.headers["retry-after"] == "1"
                assert down.json()["code"] == "unavailable"

                async def call() -> int:
                    response = await c.post("/runner/tool-calls/start", json=start_body())
                    return response.status_code

                await eventually(call, lambda code: code == 200, timeout=30, what="NATS back")
            types = await activation_types(s, activation_id)
            assert types == ["activation.tool_call_started"]
    finally:
        server.stop()


async def appended(stack: Stack, session_id: str) -> list[str]:
    stream = await stack.store.load("session", session_id)
    return [e.data.message_id for e in stream.events if isinstance(e.data, SessionMessageAppended)]


async def test_the_brokers_appends_losing_races_are_retried_never_refused(
    platform: Stack,
) -> None:
    """Another writer appends to the activation as fast as it can while the broker records
    tool calls: each call is recorded after re-reading, or answered 503 to be retried — never
    409, which the runner would take for a refusal."""
    a = await live(platform, "race")
    stop = asyncio.Event()

    async def other_replica() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            with contextlib.suppress(ConflictError):  # the broker won this one
                await platform.store.append_next(
                    a.activation_id, [ToolCallStarted(**start_body(f"other-{i}"))], ORCHESTRATOR
                )
            await asyncio.sleep(0.001)

    writer = asyncio.create_task(other_replica())
    try:
        async with broker(platform, a.token) as c:
            statuses = [
                (await c.post("/runner/tool-calls/start", json=start_body(f"c{i}"))).status_code
                for i in range(20)
            ]
    finally:
        stop.set()
        await writer
    assert set(statuses) <= {200, 503}, statuses
    assert 200 in statuses  # most win within the broker's own attempts


async def test_a_signal_payload_over_its_bound_is_422_and_records_nothing(
    platform: Stack,
) -> None:
    a = await live(platform, "sigp")
    arguments = {"kind": "reminder", "payload": {"notes": "x" * (300 * 1024)}}
    async with broker(platform, a.token) as c:
        response = await c.post(
            "/toolpacks/core/support",
            json={"operation": "signal.record", "arguments": arguments, "request_id": "r1"},
        )
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    stream = await platform.store.load("session", a.world.session_id)
    assert not [e for e in stream.events if e.envelope.type.endswith("signal_recorded")]
