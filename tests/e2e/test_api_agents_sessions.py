"""Agents (JSON and packages), sessions, messages, signals and activations through HTTP."""

from __future__ import annotations

import io
import zipfile
from datetime import datetime, timedelta, tzinfo
from typing import cast

import pytest

from suzumio.contracts import envelope as envelope_module
from suzumio.contracts.commands import CloseSession
from suzumio.contracts.events import (
    ActivationCompleted,
    ActivationRequested,
    ActivationStarted,
    ToolCallFinished,
    ToolCallStarted,
)
from suzumio.contracts.ids import new_id
from suzumio.gateway.api.pagination import encode_cursor
from suzumio.gateway.bootstrap import IDEMPOTENCY_BUCKET
from suzumio.platform.bus.commands import CommandClient
from tests.e2e.api import in_pages, new_world, ok, problem, tar_gz
from tests.e2e.runner_env import request_activation
from tests.e2e.stack import Stack

AGENT_YAML = b"""
name: reviewer
role: code reviewer
description: reviews pull requests
model: {name: gpt-4.1, provider: null}
fallbacks: [gpt-4.1-mini]
tools: [file.read]
permissions: {shell.exec: ask}
workspace_mode: mount
"""


async def test_agent_json_lifecycle(stack: Stack) -> None:
    world = await new_world(stack, "jo")
    async with stack.client(world.key) as c:
        agent = ok(await c.get(f"/v1/agents/{world.agent_id}"))
        assert (agent["name"], agent["disabled"]) == ("helper", False)
        patched = ok(
            await c.patch(
                f"/v1/agents/{world.agent_id}", json={"prompt": "Be brief.", "tools": ["file.read"]}
            )
        )
        assert (patched["prompt"], patched["tools"]) == ("Be brief.", ["file.read"])
        disabled = ok(await c.post(f"/v1/agents/{world.agent_id}/disable", json={"reason": "x"}))
        assert disabled["disabled"] is True
        problem(
            await c.post(
                f"/v1/projects/{world.project_id}/sessions", json={"agent_id": world.agent_id}
            ),
            409,
            "conflict",
        )
        assert ok(await c.post(f"/v1/agents/{world.agent_id}/enable"))["disabled"] is False
        # No body at all: the reason is optional.
        assert ok(await c.post(f"/v1/agents/{world.agent_id}/disable"))["disabled"] is True
        assert ok(await c.post(f"/v1/agents/{world.agent_id}/enable"))["disabled"] is False
        listed = ok(await c.get(f"/v1/projects/{world.project_id}/agents"))
        assert [a["id"] for a in listed["items"]] == [world.agent_id]
        problem(
            await c.post(
                f"/v1/projects/{world.project_id}/agents",
                json={
                    "name": "a",
                    "role": "r",
                    "model": {"name": "m"},
                    "runtime_profile": "missing",
                },
            ),
            422,
            "invalid",
        )
        problem(
            await c.post(
                f"/v1/projects/{world.project_id}/agents", json={"name": "a", "role": "r"}
            ),
            422,
            "invalid",
        )
        problem(await c.get("/v1/agents/nope"), 404, "not_found")


async def test_agent_package_import(stack: Stack) -> None:
    world = await new_world(stack, "kim")
    package = tar_gz(
        {
            "reviewer/agent.yaml": AGENT_YAML,
            "reviewer/prompt/system.md": b"You review code carefully.",
            "reviewer/tools.yaml": b"- file.search\n",
            "reviewer/env/env_facts.yaml": b"os: linux\nlanguage: python\n",
            "reviewer/assets/checklist.md": b"- tests\n- docs\n",
        }
    )
    url = f"/v1/projects/{world.project_id}/agents/import"
    async with stack.client(world.key) as c:
        agent = ok(await c.post(url, files={"package": ("r.tgz", package)}), 201)
        assert agent["name"] == "reviewer"
        assert agent["prompt"] == "You review code carefully."
        assert agent["tools"] == ["file.read", "file.search"]
        assert agent["env_facts"] == {"os": "linux", "language": "python"}
        assert agent["permissions"] == {"shell.exec": "ask"}
        assert [m["name"] for m in agent["fallbacks"]] == ["gpt-4.1-mini"]
        assert [a["path"] for a in agent["assets"]] == ["assets/checklist.md"]
        zipped = io.BytesIO()
        with zipfile.ZipFile(zipped, "w") as z:
            z.writestr("agent.yaml", AGENT_YAML)
        ok(await c.post(url, files={"package": ("r.zip", zipped.getvalue())}), 201)
        for bad in (
            tar_gz({"prompt/system.md": b"x"}),
            tar_gz({"../agent.yaml": AGENT_YAML}),
            tar_gz({"agent.yaml": b"name: [unclosed"}),
            b"not an archive",
            tar_gz({"agent.yaml": b"name: x\nrole: y\nmodel: m\nsurprise: 1\n"}),
        ):
            problem(await c.post(url, files={"package": ("p.tgz", bad)}), 422, "invalid")
        problem(await c.post(url, files={"other": ("p.tgz", package)}), 422, "invalid")
        problem(await c.post(url, json={"package": "x"}), 415, "unsupported_media_type")


async def test_sessions_messages_and_closing(stack: Stack) -> None:
    world = await new_world(stack, "lou")
    sid = world.session_id
    async with stack.client(world.key) as c:
        posted = [
            ok(await c.post(f"/v1/sessions/{sid}/messages", json={"text": f"m{i}"}), 201)
            for i in range(3)
        ]
        page = ok(
            await c.get(
                f"/v1/sessions/{sid}/messages",
                params={"min_position": posted[-1]["position"], "limit": 2},
            )
        )
        rest = ok(
            await c.get(f"/v1/sessions/{sid}/messages", params={"cursor": page["next_cursor"]})
        )
        assert [m["text"] for m in page["items"] + rest["items"]] == ["m0", "m1", "m2"]
        for forged in ([2**63, "x"], ["1", "x"], [True, "x"]):
            problem(
                await c.get(
                    f"/v1/sessions/{sid}/messages", params={"cursor": encode_cursor(*forged)}
                ),
                422,
                "invalid",
            )
        assert page["items"][0]["author"] == {"kind": "user", "id": world.user_id}
        signals = ok(await c.get(f"/v1/sessions/{sid}/signals", params={"status": "pending"}))
        assert {s["priority"] for s in signals["items"]} == {"P1"}
        assert {s["message_id"] for s in signals["items"]} == {p["message_id"] for p in posted}
        urgent = ok(
            await c.post(f"/v1/sessions/{sid}/messages", json={"text": "stop!", "priority": "P0"}),
            201,
        )
        signal = ok(
            await c.get(f"/v1/sessions/{sid}/signals", params={"min_position": urgent["position"]})
        )["items"][0]
        assert (signal["priority"], signal["kind"]) == ("P0", "user.message")
        timer = ok(
            await c.post(
                f"/v1/sessions/{sid}/signals",
                json={"kind": "timer", "priority": "P2", "not_before": "2030-01-01T00:00:00Z"},
            ),
            201,
        )
        assert timer["not_before"].startswith("2030-01-01")
        closed = ok(await c.post(f"/v1/sessions/{sid}/close", json={"reason": "done"}))
        assert closed["status"] == "closed"
        problem(
            await c.post(f"/v1/sessions/{sid}/messages", json={"text": "late"}), 409, "conflict"
        )
        problem(await c.post(f"/v1/sessions/{sid}/signals", json={}), 409, "conflict")
        assert ok(await c.post(f"/v1/sessions/{sid}/reopen"))["status"] == "active"
        ok(await c.post(f"/v1/sessions/{sid}/messages", json={"text": "back"}), 201)
        assert ok(await c.post(f"/v1/sessions/{sid}/close"))["status"] == "closed"  # no body
        assert ok(await c.post(f"/v1/sessions/{sid}/reopen"))["status"] == "active"
        listed = ok(
            await c.get(
                f"/v1/projects/{world.project_id}/sessions",
                params={"status": "active", "agent_id": world.agent_id},
            )
        )
        assert [s["id"] for s in listed["items"]] == [sid]
        problem(await c.post(f"/v1/sessions/{sid}/messages", json={"text": ""}), 422, "invalid")
        problem(
            await c.post(f"/v1/sessions/{sid}/messages", json={"text": "x", "priority": "P9"}),
            422,
            "invalid",
        )
        problem(
            await c.post(f"/v1/projects/{world.project_id}/sessions", json={"agent_id": "ghost"}),
            404,
            "not_found",
        )
        problem(
            await c.get(f"/v1/sessions/{sid}/messages", params={"min_position": 10**12}),
            422,
            "invalid",
        )


async def test_idempotency_key_replays_the_first_response(stack: Stack) -> None:
    world = await new_world(stack, "max")
    url = f"/v1/sessions/{world.session_id}/messages"
    headers = {"Idempotency-Key": f"k-{new_id()}"}
    async with stack.client(world.key) as c:
        first = await c.post(url, json={"text": "once"}, headers=headers)
        again = await c.post(url, json={"text": "once"}, headers=headers)
        assert (first.status_code, again.status_code) == (201, 201)
        assert again.json() == first.json()
        assert again.headers["idempotent-replayed"] == "true"
        problem(await c.post(url, json={"text": "other"}, headers=headers), 422, "invalid")
        page = ok(await c.get(url, params={"min_position": first.json()["position"]}))
        assert [m["text"] for m in page["items"]] == ["once"]
        created = await c.post("/v1/projects", json={"name": "p"}, headers=headers)
        replay = await c.post("/v1/projects", json={"name": "p"}, headers=headers)
        assert replay.json()["id"] == created.json()["id"]  # a key is scoped to its path
        problem(
            await c.post(url, json={"text": "x"}, headers={"Idempotency-Key": "a b"}),
            422,
            "invalid",
        )


async def test_a_retry_whose_first_answer_was_lost_creates_nothing_twice(stack: Stack) -> None:
    world = await new_world(stack, "lou")
    kv = await stack.nc.jetstream().key_value(stack.topology.bucket(IDEMPOTENCY_BUCKET))

    async def forget_answers() -> None:  # as if the gateway died before it kept them
        for key in await kv.keys():
            await kv.delete(key)

    message_url = f"/v1/sessions/{world.session_id}/messages"
    sessions_url = f"/v1/projects/{world.project_id}/sessions"
    headers = {"Idempotency-Key": f"k-{new_id()}"}
    async with stack.client(world.key) as c:
        first = ok(await c.post(message_url, json={"text": "once"}, headers=headers), 201)
        opened = ok(
            await c.post(sessions_url, json={"agent_id": world.agent_id}, headers=headers), 201
        )
        await forget_answers()
        # Answered as the first attempt was (tests/e2e/test_retry_after_lost_answer.py): the
        # same message and session, not a second one.
        again = await c.post(message_url, json={"text": "once"}, headers=headers)
        assert ok(again, 201) == first
        reopened = await c.post(sessions_url, json={"agent_id": world.agent_id}, headers=headers)
        assert ok(reopened, 201)["id"] == opened["id"]
        messages = ok(await c.get(message_url, params={"min_position": first["position"]}))
        sessions = ok(await c.get(sessions_url, params={"min_position": first["position"]}))
    assert [m["text"] for m in messages["items"]] == ["once"]
    assert [s["id"] for s in sessions["items"]].count(opened["id"]) == 1
    assert len(sessions["items"]) == 2  # the world's own and the one opened once


async def test_an_activations_tool_calls_come_a_page_at_a_time(stack: Stack) -> None:
    """An activation may make tens of thousands: one unbounded answer, built on the event
    loop, stalled every other request on the replica."""
    world = await new_world(stack, "tcp")
    activation_id = await request_activation(stack, world)
    calls = [
        ToolCallStarted(
            call_id=f"c{i}", tool="file.read", arguments_digest="a" * 64, arguments_size=2
        )
        for i in range(3)
    ]
    await stack.store.append(activation_id, calls, 0)
    url = f"/v1/activations/{activation_id}/tool-calls"
    async with stack.client(world.key) as c:
        listed = await in_pages(c, url, 3)
    assert [t["call_id"] for t in listed] == ["c0", "c1", "c2"]


class _ClockBehind(datetime):
    """`datetime` whose `now` is a minute behind: a writer (another replica) whose clock is."""

    @classmethod
    def now(cls, tz: tzinfo | None = None) -> _ClockBehind:
        return cast("_ClockBehind", datetime.now(tz) - timedelta(minutes=1))


async def test_a_tool_call_a_writer_with_a_clock_behind_records_is_not_skipped(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paged by `started_at` (the writing replica's clock), a call recorded after a page was
    read, by a replica whose clock is behind, sorted before that page's cursor and was never
    seen. Paged in the log's order, it comes on the next page."""
    world = await new_world(stack, "skew")
    activation_id = await request_activation(stack, world)

    def start(call_id: str) -> ToolCallStarted:
        return ToolCallStarted(
            call_id=call_id, tool="file.read", arguments_digest="a" * 64, arguments_size=2
        )

    await stack.store.append(activation_id, [start("c0"), start("c1"), start("c2")], 0)
    url = f"/v1/activations/{activation_id}/tool-calls"
    async with stack.client(world.key) as c:
        await in_pages(c, url, 3)
        first = ok(await c.get(url, params={"limit": 2}))
        assert [t["call_id"] for t in first["items"]] == ["c0", "c1"]
        with monkeypatch.context() as m:
            m.setattr(envelope_module, "datetime", _ClockBehind)
            await stack.store.append(activation_id, [start("c3")], 3)
        await in_pages(c, url, 4)  # projected
        rest = ok(await c.get(url, params={"limit": 2, "cursor": first["next_cursor"]}))
    assert [t["call_id"] for t in rest["items"]] == ["c2", "c3"]
    assert rest["items"][1]["started_at"] < first["items"][0]["started_at"]


async def test_activations_and_tool_calls_are_readable(stack: Stack) -> None:
    world = await new_world(stack, "ned")
    activation_id, call_id = new_id(), "call-1"
    head = await stack.store.head("session", world.session_id)
    await stack.store.append(
        world.session_id,
        [ActivationRequested(activation_id=activation_id, agent_id=world.agent_id, signal_ids=())],
        head.version,
    )
    result = await stack.store.append(
        activation_id,
        [
            ActivationStarted(
                session_id=world.session_id,
                project_id=world.project_id,
                agent_id=world.agent_id,
                backend="process",
            ),
            ToolCallStarted(
                call_id=call_id, tool="file.read", arguments_digest="a" * 64, arguments_size=10
            ),
            ToolCallFinished(call_id=call_id, status="ok", duration_ms=5),
            ActivationCompleted(text="done", usage={"total_tokens": 42}),
        ],
        0,
    )
    async with stack.client(world.key) as c:
        listed = ok(
            await c.get(
                f"/v1/sessions/{world.session_id}/activations", params={"min_position": result.seq}
            )
        )
        assert [a["id"] for a in listed["items"]] == [activation_id]
        activation = ok(await c.get(f"/v1/activations/{activation_id}"))
        assert (activation["status"], activation["output_text"]) == ("completed", "done")
        assert activation["usage"] == {"total_tokens": 42}
        calls = ok(await c.get(f"/v1/activations/{activation_id}/tool-calls"))["items"]
        assert [(t["call_id"], t["status"], t["duration_ms"]) for t in calls] == [
            (call_id, "ok", 5)
        ]
        problem(await c.get("/v1/activations/none"), 404, "not_found")


async def test_signals_recorded_through_the_api_cannot_pose_as_others(stack: Stack) -> None:
    world = await new_world(stack, "oz")
    async with stack.client(world.key) as c:
        for kind in ("approval.result", "user.message", "artifact.ready"):
            problem(
                await c.post(f"/v1/sessions/{world.session_id}/signals", json={"kind": kind}),
                422,
                "invalid",
            )
        problem(
            await c.post(
                f"/v1/sessions/{world.session_id}/signals", json={"payload": {"bad": "nul\u0000"}}
            ),
            422,
            "invalid",
        )


async def test_a_command_found_done_already_says_how_far_the_log_is(stack: Stack) -> None:
    """A close that finds the session closed (a second client, a retry after a lost reply)
    replies where the session stands, so its caller's read waits for the projection to show
    it closed; before, it replied position 0 and the read could show it still active."""
    world = await new_world(stack, "nia")
    commands = CommandClient(stack.nc, stack.topology)
    close = CloseSession(session_id=world.session_id, reason="done")
    first = await commands.send(close, actor=f"user:{world.user_id}")
    assert first.events
    again = await commands.send(close, actor=f"user:{world.user_id}")
    assert again.events == ()
    head = await stack.store.head("session", world.session_id)
    assert again.position == head.seq == first.position
