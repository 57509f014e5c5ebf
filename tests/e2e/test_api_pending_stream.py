"""Pending actions (answer, expiry) and the live stream (SSE and WebSocket)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import httpx
from websockets.asyncio.client import connect as ws_connect

from suzumio.contracts.commands import CreatePendingAction
from suzumio.contracts.ids import new_id
from suzumio.contracts.live import LiveChunk
from suzumio.contracts.values import PendingKind
from suzumio.platform.bus.commands import CommandClient
from tests.e2e.api import World, new_world, ok, problem
from tests.e2e.stack import Stack
from tests.support import eventually


async def ask(
    stack: Stack, world: World, kind: PendingKind, timeout: int = 600, **extra: Any
) -> str:
    action_id = new_id()
    command = CreatePendingAction(
        pending_action_id=action_id,
        session_id=world.session_id,
        kind=kind,
        prompt="Deploy?",
        timeout_seconds=timeout,
        **extra,
    )
    await CommandClient(stack.nc, stack.topology).send(command, actor="system:toolbroker")
    return action_id


async def test_approval_is_answered_and_wakes_the_agent(stack: Stack) -> None:
    world = await new_world(stack, "rae")
    action_id = await ask(stack, world, PendingKind.APPROVAL, options=("yes", "no"))
    async with stack.client(world.key) as c:
        listed = await eventually(
            lambda: c.get(f"/v1/sessions/{world.session_id}/pending-actions"),
            lambda r: r.status_code == 200 and len(r.json()) == 1,
            what="the pending action",
        )
        assert listed.json()[0]["status"] == "open"
        problem(
            await c.post(f"/v1/pending-actions/{action_id}/reply", json={"answer": "yes"}),
            422,
            "invalid",
        )
        problem(
            await c.post(
                f"/v1/pending-actions/{action_id}/reply", json={"answer": "maybe", "approved": True}
            ),
            422,
            "invalid",
        )
        answered = ok(
            await c.post(
                f"/v1/pending-actions/{action_id}/reply", json={"answer": "yes", "approved": True}
            )
        )
        assert (answered["status"], answered["approved"]) == ("answered", True)
        assert answered["answered_by"] == f"user:{world.user_id}"
        problem(
            await c.post(
                f"/v1/pending-actions/{action_id}/reply", json={"answer": "no", "approved": False}
            ),
            409,
            "conflict",
        )
        signals = ok(await c.get(f"/v1/sessions/{world.session_id}/signals"))["items"]
        wake = [s for s in signals if s["kind"] == "approval.result"]
        assert len(wake) == 1
        assert (wake[0]["priority"], wake[0]["payload"]["approved"]) == ("P1", True)
        problem(await c.get("/v1/pending-actions/unknown"), 404, "not_found")


async def test_unanswered_question_expires_on_time(stack: Stack) -> None:
    world = await new_world(stack, "sam")
    action_id = await ask(stack, world, PendingKind.QUESTION, timeout=1)
    async with stack.client(world.key) as c:
        expired = await eventually(
            lambda: c.get(f"/v1/pending-actions/{action_id}"),
            lambda r: r.status_code == 200 and r.json()["status"] == "expired",
            timeout=15,
            what="expiry",
        )
        body = expired.json()
        assert datetime.fromisoformat(body["closed_at"]) >= datetime.fromisoformat(
            body["expires_at"]
        )
        signals = ok(await c.get(f"/v1/sessions/{world.session_id}/signals"))["items"]
        assert [
            s["payload"]["outcome"] for s in signals if "pending_action_id" in s["payload"]
        ] == ["expired"]
        problem(
            await c.post(f"/v1/pending-actions/{action_id}/reply", json={"answer": "late"}),
            409,
            "conflict",
        )


async def publish_chunk(stack: Stack, world: World, text: str) -> None:
    chunk = LiveChunk(
        session_id=world.session_id,
        activation_id="act-1",
        kind="text",
        text=text,
        at=datetime.now(UTC),
    )
    await stack.nc.jetstream().publish(
        stack.topology.live_subject(world.session_id), chunk.model_dump_json().encode()
    )


class SseReader:
    """Reads server-sent events off one response, in as many calls as wanted."""

    def __init__(self, response: httpx.Response) -> None:
        self._lines = response.aiter_lines()

    async def read(self, count: int) -> list[dict[str, str]]:
        events: list[dict[str, str]] = []
        current: dict[str, str] = {}
        while len(events) < count:
            line = await asyncio.wait_for(anext(self._lines), 10)
            if not line:
                if "event" in current:
                    events.append(current)
                current = {}
            elif not line.startswith(":") and ":" in line:
                key, _, value = line.partition(":")
                current[key] = current.get(key, "") + value.lstrip()
        return events


async def test_sse_streams_history_and_live_output_and_resumes(stack: Stack) -> None:
    world = await new_world(stack, "tia")
    url = f"/v1/sessions/{world.session_id}/stream"
    async with stack.client(world.key) as c:
        ok(await c.post(f"/v1/sessions/{world.session_id}/messages", json={"text": "hi"}), 201)
        async with c.stream("GET", url) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            reader = SseReader(response)
            first = await reader.read(3)
            await publish_chunk(stack, world, "Hel")
            await publish_chunk(stack, world, "lo")
            live = await reader.read(2)
        assert [e["event"] for e in first] == [
            "session.opened",
            "session.message_appended",
            "session.signal_recorded",
        ]
        assert json.loads(first[1]["data"])["data"]["text"] == "hi"
        assert [json.loads(e["data"])["text"] for e in live] == ["Hel", "lo"]
        # Resume after the first live chunk: only what came after it.
        await publish_chunk(stack, world, "!")
        async with c.stream("GET", url, headers={"Last-Event-ID": live[0]["id"]}) as response:
            resumed = await SseReader(response).read(2)
        assert [json.loads(e["data"])["text"] for e in resumed] == ["lo", "!"]
        problem(await c.get(url, headers={"Last-Event-ID": "nonsense"}), 422, "invalid")


async def test_websocket_variant(stack: Stack) -> None:
    world = await new_world(stack, "uma")
    ws_url = stack.api.replace("http", "ws") + f"/v1/sessions/{world.session_id}/ws"
    async with ws_connect(
        ws_url, additional_headers={"Authorization": f"Bearer {world.key}"}
    ) as ws:
        opened = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert opened["event"] == "session.opened"
        await publish_chunk(stack, world, "over ws")
        chunk = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert (chunk["event"], chunk["data"]["text"]) == ("live", "over ws")
    async with ws_connect(ws_url + f"?access_token={world.key}&last_event_id={opened['id']}") as ws:
        again = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert again["data"]["text"] == "over ws"
