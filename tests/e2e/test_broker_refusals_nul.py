"""NUL characters, which the log's read models cannot hold (Postgres text and jsonb), in text
the tool-broker would store: every route refuses them with a 422 before the call has any effect
— never a 500, and never accepted to be parked later by a projection. Runs against the real
session, scheduler, tool-broker and gateway processes."""

from __future__ import annotations

from typing import Any

import nats.errors
import pytest

from suzumio.contracts.ids import new_id
from suzumio.contracts.policies import approval_id, arguments_digest
from tests.e2e.stack import Stack
from tests.e2e.test_broker_access import activation_types, broker, live, start_body
from tests.e2e.test_broker_limits import appended

NUL = "a\u0000b"


def entry(**fields: Any) -> dict[str, Any]:
    return {"message_id": new_id(), "role": "tool", "text": "ok", **fields}


def approval(session_id: str, tool: str, written: str) -> dict[str, Any]:
    pending = approval_id(session_id, tool, arguments_digest(written), 0)
    return {
        "pending_action_id": pending,
        "kind": "approval",
        "prompt": "run it?",
        "tool": tool,
        "approved_call": written,
    }


def calls(session_id: str) -> list[tuple[str, str, dict[str, Any]]]:
    """Each route's stored text, with a NUL in it."""
    a_call = {"id": "c1", "name": "shell.exec", "arguments": "{}"}
    archived = {"archived_from": new_id(), "archived_through": new_id()}
    support = "/toolpacks/core/support"
    return [
        ("POST", "/runner/history", {"entries": [entry(text=NUL)]}),
        ("POST", "/runner/history", {"entries": [entry(tool_call_id=NUL)]}),
        ("POST", "/runner/history", {"entries": [entry(name=NUL)]}),
        ("POST", "/runner/history", {"entries": [entry(tool_calls=[{**a_call, "id": NUL}])]}),
        (
            "POST",
            "/runner/history",
            {"entries": [entry(tool_calls=[{**a_call, "arguments": '{"a": "' + NUL + '"}'}])]},
        ),
        ("POST", "/runner/history/compaction", {"marker_id": new_id(), "summary": NUL, **archived}),
        ("PUT", "/runner/checkpoint", {"checkpoint_id": new_id(), "data": {"k": NUL}}),
        ("PUT", "/runner/checkpoint", {"checkpoint_id": new_id(), "data": {NUL: [1, {"k": 2}]}}),
        ("POST", "/runner/ask", {"pending_action_id": new_id(), "prompt": NUL}),
        ("POST", "/runner/ask", {"pending_action_id": new_id(), "prompt": "?", "options": [NUL]}),
        # An approval's tool and call go into its prompt: a NUL there failed the command (a
        # 500) — its id is the sandbox's to compute.
        ("POST", "/runner/ask", approval(session_id, NUL, "{}")),
        ("POST", "/runner/ask", approval(session_id, "shell.exec", NUL)),
        (
            "POST",
            support,
            {
                "operation": "message.send",
                "request_id": "r1",
                "arguments": {"session_id": session_id, "text": NUL},
            },
        ),
        (
            "POST",
            support,
            {"operation": "signal.record", "request_id": "r2", "arguments": {"kind": NUL}},
        ),
        ("POST", "/runner/tool-calls/start", {**start_body(), "call_id": NUL}),
        ("POST", "/runner/tool-calls/start", {**start_body("c2"), "tool": NUL}),
        ("POST", "/activation-output", {"text": NUL}),
        ("POST", "/activation-output", {"text": "done", "usage": {"model": NUL}}),
    ]


async def test_stored_text_with_nul_is_422_and_changes_nothing(platform: Stack) -> None:
    a = await live(platform, "nul")
    session_before = await platform.store.load("session", a.world.session_id)
    async with broker(platform, a.token) as c:
        started = await c.post("/runner/tool-calls/start", json=start_body("c1"))
        assert started.status_code == 200, started.text
        finish = {"call_id": "c1", "status": "error", "duration_ms": 1, "error": NUL}
        refused = [(await c.post("/runner/tool-calls/finish", json=finish))]
        for method, path, body in calls(a.world.session_id):
            refused.append(await c.request(method, path, json=body))
    assert [(r.status_code, r.headers["content-type"]) for r in refused] == [
        (422, "application/problem+json")
    ] * len(refused), [(r.request.url.path, r.status_code, r.text[:200]) for r in refused]
    session = await platform.store.load("session", a.world.session_id)
    assert session.version == session_before.version  # no entry, marker, checkpoint, question
    assert await activation_types(platform, a.activation_id) == ["activation.tool_call_started"]


async def test_a_final_call_with_nul_in_its_history_publishes_nothing(platform: Stack) -> None:
    """The final call's parts are checked before any has an effect: its live batch is not
    published, its other entry not appended, the output not recorded."""
    a = await live(platform, "nulfin")
    sub = await platform.nc.jetstream().subscribe(
        platform.topology.live_subject(a.world.session_id), ordered_consumer=True
    )
    body = {
        "text": "done",
        "history": [entry(role="assistant", text="fine"), entry(text=NUL)],
        "live": {"batch": 0, "chunks": [{"kind": "text", "text": "do"}]},
    }
    async with broker(platform, a.token) as c:
        response = await c.post("/activation-output", json=body)
    assert response.status_code == 422, response.text
    with pytest.raises(nats.errors.TimeoutError):
        await sub.next_msg(timeout=0.5)
    await sub.unsubscribe()
    assert await appended(platform, a.world.session_id) == []
    assert await activation_types(platform, a.activation_id) == []
