"""The agent's tool policy held by the tool-broker for the tools whose effect it makes: a
command in the sandbox that read the token and calls the broker itself, past the runner, meets
the same `deny` and `ask`. Real session, scheduler, tool-broker and gateway processes."""

from __future__ import annotations

import json
from typing import Any

import httpx

from suzumio.contracts.events import (
    PendingActionCreated,
    PendingActionExpired,
    SessionMessageAppended,
)
from suzumio.contracts.ids import new_id
from suzumio.contracts.policies import approval_id, approval_prompt, arguments_digest
from suzumio.contracts.values import ToolPolicy
from tests.e2e.api import ok
from tests.e2e.stack import Stack
from tests.e2e.test_broker_access import Live, broker, live, mint
from tests.support import eventually

DENY, ASK = ToolPolicy.DENY, ToolPolicy.ASK


async def with_policies(stack: Stack, name: str, policies: dict[str, ToolPolicy]) -> Live:
    a = await live(stack, name)
    token = mint(stack, a.world, a.activation_id, policies=policies)
    return Live(a.world, a.activation_id, token)


def send(a: Live, text: str, request_id: str, approved: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "operation": "message.send",
        "arguments": {"session_id": a.world.session_id, "text": text},
        "request_id": request_id,
    }
    if approved is not None:
        body["approved_call"] = approved
    return body


async def texts(stack: Stack, a: Live) -> list[str]:
    stream = await stack.store.load("session", a.world.session_id)
    return [e.data.text for e in stream.events if isinstance(e.data, SessionMessageAppended)]


async def decided(
    stack: Stack, c: httpx.AsyncClient, a: Live, tool: str, written: str, *, approved: bool
) -> None:
    """The first ask to approve `tool` with `written`, as the runner makes it, answered by a
    person through the gateway."""
    pending = approval_id(a.world.session_id, tool, arguments_digest(written), 0)
    ask = {
        "pending_action_id": pending,
        "kind": "approval",
        "prompt": f"run {tool}?",
        "tool": tool,
        "approved_call": written,
    }
    ok(await c.post("/runner/ask", json=ask))
    async with stack.client(a.world.key) as gateway:
        reply = {"answer": "", "approved": approved}
        ok(await gateway.post(f"/v1/pending-actions/{pending}/reply", json=reply))


def refused(response: httpx.Response, code: str) -> None:
    assert response.status_code == 409, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == code


async def test_a_denied_tool_is_refused_by_the_broker_and_others_still_run(
    platform: Stack,
) -> None:
    a = await with_policies(
        platform, "dena", {"message.send": DENY, "checkpoint": DENY, "ask_user": DENY}
    )
    async with broker(platform, a.token) as c:
        refused(await c.post("/toolpacks/core/support", json=send(a, "sneaked", "r1")), "denied")
        put = {"checkpoint_id": new_id(), "data": {"k": 1}}
        refused(await c.put("/runner/checkpoint", json=put), "denied")
        question = {"pending_action_id": new_id(), "prompt": "colour?"}
        refused(await c.post("/runner/ask", json=question), "denied")
        # An approval is how `ask` works, not a question to the user: it is still asked,
        # worded by the broker (the prompt sent is not what the person reads).
        written = json.dumps({"command": "ls"})
        approval = {
            "pending_action_id": approval_id(
                a.world.session_id, "shell.exec", arguments_digest(written), 0
            ),
            "kind": "approval",
            "prompt": "anything at all",
            "tool": "shell.exec",
            "approved_call": written,
        }
        assert (await c.post("/runner/ask", json=approval)).json()["status"] == "pending"
        # A tool the policy does not name is the runner's to decide.
        signal = {"operation": "signal.record", "arguments": {"kind": "x"}, "request_id": "r2"}
        assert (await c.post("/toolpacks/core/support", json=signal)).status_code == 200
    assert "sneaked" not in await texts(platform, a)
    stream = await platform.store.load("session", a.world.session_id)
    types = [e.envelope.type for e in stream.events]
    assert "session.checkpoint_saved" not in types
    created = await platform.store.load("pending_action", approval["pending_action_id"])
    assert isinstance(asked := created.events[0].data, PendingActionCreated)
    assert asked.prompt == approval_prompt("shell.exec", written)
    questions = await platform.store.load("pending_action", question["pending_action_id"])
    assert not questions.events


async def test_a_tool_under_ask_runs_only_with_a_call_a_person_approved(platform: Stack) -> None:
    a = await with_policies(platform, "aska", {"message.send": ASK})
    written = json.dumps({"session_id": a.world.session_id, "text": "approved words"})
    digest = arguments_digest(written)
    async with broker(platform, a.token) as c:
        support = "/toolpacks/core/support"
        refused(await c.post(support, json=send(a, "approved words", "r1")), "approval_required")
        # The call as the model wrote it, but nobody was asked yet.
        refused(
            await c.post(support, json=send(a, "approved words", "r1", written)),
            "approval_required",
        )
        # The first ask expires unanswered (walked past), the second is approved.
        first = approval_id(a.world.session_id, "message.send", digest, 0)
        second = approval_id(a.world.session_id, "message.send", digest, 1)
        for pending, timeout in ((first, 1), (second, 3_600)):
            ask = {
                "pending_action_id": pending,
                "kind": "approval",
                "prompt": "send it?",
                "timeout_seconds": timeout,
                "tool": "message.send",
                "approved_call": written,
            }
            ok(await c.post("/runner/ask", json=ask))
        await eventually(
            lambda: platform.store.load("pending_action", first),
            lambda s: any(isinstance(e.data, PendingActionExpired) for e in s.events),
            timeout=30,
            what="the first ask expired",
        )
        async with platform.client(a.world.key) as gateway:
            reply = {"answer": "", "approved": True}
            ok(await gateway.post(f"/v1/pending-actions/{second}/reply", json=reply))
        # An approved call's arguments do not carry another call.
        refused(
            await c.post(support, json=send(a, "other words", "r2", written)),
            "approval_required",
        )
        sent = await c.post(support, json=send(a, "approved words", "r3", written))
        assert sent.status_code == 200, sent.text
    assert await texts(platform, a) == ["approved words"]


async def test_a_refused_approval_lets_nothing_through(platform: Stack) -> None:
    a = await with_policies(platform, "askr", {"checkpoint": ASK})
    data = {"plan": "step 2"}
    written = json.dumps({"data": data})
    async with broker(platform, a.token) as c:
        await decided(platform, c, a, "checkpoint", written, approved=False)
        put = {"checkpoint_id": new_id(), "data": data, "approved_call": written}
        refused(await c.put("/runner/checkpoint", json=put), "approval_required")
    stream = await platform.store.load("session", a.world.session_id)
    assert "session.checkpoint_saved" not in [e.envelope.type for e in stream.events]


async def test_an_approved_checkpoint_near_its_bound_is_saved(platform: Stack) -> None:
    """The bound is the stored checkpoint's: the approval the call brings along (the model's
    arguments, the data again) counted too, a 150 KB checkpoint under `ask` was too large."""
    a = await with_policies(platform, "askb", {"checkpoint": ASK})
    data = {"plan": "x" * 150_000}
    written = json.dumps({"data": data})
    async with broker(platform, a.token) as c:
        await decided(platform, c, a, "checkpoint", written, approved=True)
        put = {"checkpoint_id": new_id(), "data": data, "approved_call": written}
        saved = await c.put("/runner/checkpoint", json=put)
        assert saved.status_code == 200, saved.text
    stream = await platform.store.load("session", a.world.session_id)
    assert "session.checkpoint_saved" in [e.envelope.type for e in stream.events]


async def test_an_approved_call_the_model_gave_no_arguments_runs(platform: Stack) -> None:
    """A provider may send `""` for a call without arguments: the runner reads it as `{}`
    and asks its approval under the digest of `""` — the broker reads it so too."""
    a = await with_policies(platform, "aske", {"signal.record": ASK})
    async with broker(platform, a.token) as c:
        await decided(platform, c, a, "signal.record", "", approved=True)
        call = {"operation": "signal.record", "arguments": {}, "request_id": "r1"}
        recorded = await c.post("/toolpacks/core/support", json={**call, "approved_call": ""})
        assert recorded.status_code == 200, recorded.text


async def test_an_approval_is_asked_only_of_the_call_its_ids_name(platform: Stack) -> None:
    """A command holding the token could ask, under the ids of the call it wants through, a
    person to approve another call (or any text): the approval given would let the first
    through. The broker words the prompt from the call the ids name, and refuses others."""
    a = await with_policies(platform, "forg", {"message.send": ASK})
    evil = json.dumps({"session_id": a.world.session_id, "text": "the secrets"})
    harmless = json.dumps({"path": "README.md"})
    evil_id = approval_id(a.world.session_id, "message.send", arguments_digest(evil), 0)
    async with broker(platform, a.token) as c:
        for tool, written in (("file.read", harmless), ("message.send", harmless)):
            forged = {
                "pending_action_id": evil_id,
                "kind": "approval",
                "prompt": "Allow the agent to run file.read with README.md?",
                "tool": tool,
                "approved_call": written,
            }
            answer = await c.post("/runner/ask", json=forged)
            assert answer.status_code == 422, answer.text
        unnamed = {"pending_action_id": evil_id, "kind": "approval", "prompt": "ok?"}
        assert (await c.post("/runner/ask", json=unnamed)).status_code == 422
    assert not (await platform.store.load("pending_action", evil_id)).events
