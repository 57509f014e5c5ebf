"""Refusals of the gateway found in review: bodies past the bound before anyone is known,
Idempotency-Key slots that follow the key actually used, cursors past the log's end, keys
the database cannot even look up, and upload forms with text fields without end."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import quote

import httpx
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from suzumio.platform.bus.jsapi import stream_last_seq
from tests.e2e.api import new_user, new_world, ok, problem
from tests.e2e.stack import Stack

MiB = 1 << 20


async def _chunks(head: bytes, filler: bytes, total: int) -> AsyncIterator[bytes]:
    """`head`, then `filler` up to `total` bytes, sent chunked (no Content-Length)."""
    yield head
    sent = len(head)
    while sent < total:
        chunk = filler[: total - sent]
        yield chunk
        sent += len(chunk)


async def test_a_body_past_the_bound_is_refused_before_the_caller_is_known(stack: Stack) -> None:
    # FastAPI reads a JSON body whole before any dependency (the key check among them) runs:
    # without a bound, anyone who reaches the port makes the gateway hold what they send.
    async with httpx.AsyncClient(base_url=stack.api, timeout=60) as c:
        url = "/v1/projects/p1/providers/x"
        size = 48 * MiB
        streamed = await c.put(
            url,
            content=_chunks(b'{"model": "m"', b" " * MiB, size),
            headers={"Content-Type": "application/json", "Content-Length": str(size)},
        )
        problem(streamed, 413, "too_large")
        problem(await c.get("/v1/me"), 401, "unauthenticated")  # and the gateway goes on


async def test_a_body_cut_off_by_the_bound_runs_nothing_under_an_idempotency_key(
    stack: Stack,
) -> None:
    key, _ = await new_user(stack, "cut-body")
    async with stack.client(key) as c:
        before = ok(await c.get("/v1/projects"))["items"]
        # Chunked, so the bound cuts it as it comes; valid JSON at every cut: the request
        # must not run with the part that came.
        with contextlib.suppress(httpx.TransportError):  # refused with the body unread
            cut = await c.post(
                "/v1/projects",
                content=_chunks(b'{"name": "cut"}', b" " * MiB, 40 * MiB),
                headers={"Content-Type": "application/json", "Idempotency-Key": "cut-1"},
            )
            problem(cut, 413, "too_large")
    await asyncio.sleep(1.0)
    async with stack.client(key) as c:
        assert ok(await c.get("/v1/projects"))["items"] == before


async def test_an_idempotency_slot_belongs_to_the_key_that_authenticated(stack: Stack) -> None:
    # A proxy in front may add its own `Authorization` (not a Bearer) to every request while
    # callers authenticate with X-API-Key: that header is not who the caller is.
    first_key, _ = await new_user(stack, "slot-a")
    second_key, second_id = await new_user(stack, "slot-b")
    proxy = {"Authorization": "Basic cHJveHk6cHJveHk=", "Idempotency-Key": "new-key-1"}
    async with httpx.AsyncClient(base_url=stack.api, timeout=30) as c:
        first = ok(
            await c.post(
                "/v1/me/api-keys", json={"name": "k"}, headers={**proxy, "X-API-Key": first_key}
            ),
            201,
        )
        second = await c.post(
            "/v1/me/api-keys", json={"name": "k"}, headers={**proxy, "X-API-Key": second_key}
        )
        created = ok(second, 201)
        assert second.headers.get("Idempotent-Replayed") is None
        assert created["api_key"] != first["api_key"]  # never another user's key
        mine = ok(await c.get("/v1/me", headers={"X-API-Key": created["api_key"]}))
        assert mine["id"] == second_id


async def test_a_stream_cursor_past_the_end_of_the_log_is_refused(stack: Stack) -> None:
    world = await new_world(stack, "far-cursor")
    end = await stream_last_seq(stack.nc, stack.topology.events_stream)
    url = f"/v1/sessions/{world.session_id}/stream"
    async with stack.client(world.key) as c:
        for cursor in (f"{end + 1000}.0", "9999999999999999999.0"):
            # (the read timeout: unrefused, such a stream would just stay silent)
            refused = await c.get(url, headers={"Last-Event-ID": cursor}, timeout=10)
            problem(refused, 422, "invalid")
            problem(await c.get(url, params={"since": cursor}, timeout=10), 422, "invalid")
        async with c.stream("GET", url, headers={"Last-Event-ID": f"{end}.0"}) as fine:
            assert fine.status_code == 200  # the end itself is where a caught-up client is
    ws_url = stack.api.replace("http", "ws") + f"/v1/sessions/{world.session_id}/ws"
    headers = {"Authorization": f"Bearer {world.key}"}
    async with ws_connect(
        f"{ws_url}?last_event_id={end + 1000}.0", additional_headers=headers
    ) as ws:
        with pytest.raises(ConnectionClosed) as info:
            await asyncio.wait_for(ws.recv(), 10)
    assert info.value.rcvd is not None
    assert info.value.rcvd.code == 4422


async def test_a_key_the_database_cannot_hold_is_just_not_valid(stack: Stack) -> None:
    world = await new_world(stack, "nul-key")
    ws_url = stack.api.replace("http", "ws") + f"/v1/sessions/{world.session_id}/ws"
    for token in (
        "szm_\x00ab_" + "x" * 20,
        "szm_AB/..;_" + "x" * 20,
        "szm_" + "a" * 40 + "_" + "x" * 20,
    ):
        async with ws_connect(f"{ws_url}?access_token={quote(token)}") as ws:
            with pytest.raises(ConnectionClosed) as info:
                await asyncio.wait_for(ws.recv(), 10)
        assert info.value.rcvd is not None
        assert info.value.rcvd.code == 4401
    async with httpx.AsyncClient(base_url=stack.api, timeout=30) as c:
        problem(
            await c.get("/v1/me", headers={"X-API-Key": "szm_AB/.._" + "x" * 20}),
            401,
            "unauthenticated",
        )


async def test_upload_text_fields_are_bounded_as_a_whole(stack: Stack) -> None:
    world = await new_world(stack, "many-fields")
    fields = {f"field{i}": "v" * 1024 for i in range(200)}  # each small, together 200 KiB
    async with stack.client(world.key) as c:
        refused = await c.post(
            f"/v1/projects/{world.project_id}/artifacts",
            files=[("file", ("a.txt", b"a", "text/plain"))],
            data=fields,
        )
        problem(refused, 413, "too_large")
        listed = ok(await c.get(f"/v1/projects/{world.project_id}/artifacts"))
        assert listed["items"] == []
        fine = await c.post(
            f"/v1/projects/{world.project_id}/artifacts",
            files=[("file", ("a.txt", b"a", "text/plain"))],
            data={"session_id": world.session_id, "note": "n" * 1000},
        )
        assert ok(fine, 201)["items"][0]["path"] == "a.txt"
