"""The tool-broker's door: what a token must be for a call to have any effect. Runs against
the real session, scheduler, tool-broker and gateway processes."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import nats.errors
import pytest
from nats.aio.msg import Msg

from suzumio.contracts.commands import AppendHistory, Command, CreatePendingAction, RecordSignal
from suzumio.contracts.commands.sessions import HistoryEntry
from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.errors import ForbiddenError
from suzumio.contracts.events import (
    ActivationCancelRequested,
    ActivationCompleted,
    ActivationStarted,
    PendingActionCreated,
    SessionMessageAppended,
    SignalRecorded,
    ToolCallFinished,
    ToolCallStarted,
)
from suzumio.contracts.ids import new_id
from suzumio.contracts.policies import approval_id, arguments_digest
from suzumio.contracts.values import Author, PendingKind
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.jsapi import ensure_streams
from suzumio.platform.tokens import TokenSigner
from tests.e2e.api import World, new_world
from tests.e2e.runner_env import request_activation
from tests.e2e.stack import Stack, running_stack
from tests.support import eventually


@dataclass
class Live:
    world: World
    activation_id: str
    token: str


def mint(stack: Stack, world: World, activation_id: str, **kw: Any) -> str:
    signer = TokenSigner([kw.pop("key", stack.secret_key)])
    return signer.issue(
        activation_id=activation_id,
        session_id=kw.pop("session_id", world.session_id),
        project_id=world.project_id,
        agent_id=world.agent_id,
        ttl=kw.pop("ttl", timedelta(minutes=5)),
        **kw,
    )


async def live(stack: Stack, name: str) -> Live:
    world = await new_world(stack, name)
    activation_id = await request_activation(stack, world)
    return Live(world, activation_id, mint(stack, world, activation_id))


def broker(stack: Stack, token: str | None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(base_url=stack.url_of("toolbroker"), headers=headers, timeout=30)


def start_body(call_id: str = "call-1") -> dict[str, Any]:
    return {
        "call_id": call_id,
        "tool": "file.read",
        "arguments_digest": hashlib.sha256(b"{}").hexdigest(),
        "arguments_size": 2,
    }


ORCHESTRATOR = EventMeta(actor="system:orchestrator")


def started(a: Live) -> ActivationStarted:
    """The orchestrator's first word on an activation."""
    w = a.world
    return ActivationStarted(
        session_id=w.session_id, project_id=w.project_id, agent_id=w.agent_id, backend="process"
    )


async def activation_types(stack: Stack, activation_id: str) -> list[str]:
    stream = await stack.store.load("activation", activation_id)
    return [e.envelope.type for e in stream.events]


async def test_every_tool_call_is_audited_with_status_and_duration(platform: Stack) -> None:
    a = await live(platform, "audra")
    async with broker(platform, a.token) as c:
        assert (await c.post("/runner/tool-calls/start", json=start_body())).json() == {
            "recorded": True
        }
        again = await c.post("/runner/tool-calls/start", json=start_body())
        assert again.json() == {"recorded": False}  # a retry records nothing twice
        finish = {"call_id": "call-1", "status": "ok", "duration_ms": 37, "result_size": 5}
        assert (await c.post("/runner/tool-calls/finish", json=finish)).status_code == 200
        orphan = await c.post("/runner/tool-calls/finish", json={**finish, "call_id": "nope"})
        assert orphan.status_code == 409
        read = {**start_body("call-2"), "read_only": True}  # what the scheduler's nudge reads
        assert (await c.post("/runner/tool-calls/start", json=read)).status_code == 200
    stream = await platform.store.load("activation", a.activation_id)
    started = [e.data for e in stream.events if isinstance(e.data, ToolCallStarted)]
    [finished] = [e.data for e in stream.events if isinstance(e.data, ToolCallFinished)]
    assert [(s.call_id, s.tool, s.read_only) for s in started] == [
        ("call-1", "file.read", False),  # a runner from before says nothing: not read-only
        ("call-2", "file.read", True),
    ]
    assert (finished.status, finished.duration_ms) == ("ok", 37)


@pytest.mark.parametrize(
    "case", ["missing", "garbage", "forged", "expired", "other_session", "never_requested"]
)
async def test_bad_tokens_are_refused_and_change_nothing(platform: Stack, case: str) -> None:
    a = await live(platform, f"t{case[:4]}")
    tokens: dict[str, str | None] = {
        "missing": None,
        "garbage": "sza1.not-a-token",
        "forged": mint(platform, a.world, a.activation_id, key=TokenSigner.__name__ * 4),
        "expired": TokenSigner([platform.secret_key]).issue(
            activation_id=a.activation_id,
            session_id=a.world.session_id,
            project_id=a.world.project_id,
            agent_id=a.world.agent_id,
            ttl=timedelta(seconds=1),
            now=datetime.now(UTC) - timedelta(minutes=5),
        ),
        "other_session": mint(platform, a.world, a.activation_id, session_id=new_id()),
        "never_requested": mint(platform, a.world, new_id()),
    }
    expected = 401 if case in {"missing", "garbage", "forged", "expired"} else 403
    async with broker(platform, tokens[case]) as c:
        for method, path, body in (
            ("POST", "/runner/tool-calls/start", start_body()),
            (
                "POST",
                "/runner/history",
                {"entries": [{"message_id": new_id(), "role": "assistant", "text": "x"}]},
            ),
            ("POST", "/activation-output", {"text": "stolen result"}),
            ("PUT", "/runner/checkpoint", {"checkpoint_id": new_id(), "data": {}}),
            (
                "POST",
                "/toolpacks/core/support",
                {"operation": "signal.record", "arguments": {"kind": "x"}, "request_id": "r"},
            ),
        ):
            response = await c.request(method, path, json=body)
            assert response.status_code == expected, (path, response.text)
            assert response.headers["content-type"] == "application/problem+json"
    assert await activation_types(platform, a.activation_id) == []
    session = await platform.store.load("session", a.world.session_id)
    assert [e.envelope.type for e in session.events][-1] == "session.activation_requested"


async def test_a_cancelled_activation_is_fenced_at_once(platform: Stack) -> None:
    a = await live(platform, "fenn")
    async with broker(platform, a.token) as c:
        assert (await c.post("/runner/tool-calls/start", json=start_body("c1"))).status_code == 200
        await platform.store.append_next(
            a.world.session_id,
            [ActivationCancelRequested(activation_id=a.activation_id, reason="replaced")],
            EventMeta(actor="system:scheduler"),
        )
        # No waiting: the very next call sees the cancel, whatever the broker's lag.
        refused = await c.post("/runner/tool-calls/start", json=start_body("c2"))
        assert refused.status_code == 403
        assert refused.json()["code"] == "fenced"
        output = await c.post("/activation-output", json={"text": "too late"})
        assert output.status_code == 403
    assert await activation_types(platform, a.activation_id) == ["activation.tool_call_started"]


async def refused_after_a_cancel(
    platform: Stack, a: Live, command: Callable[[str], Command]
) -> tuple[str, str]:
    """`command` (made of a new id) sent as the broker sends it, once before the activation's
    cancel is stored, and once after — refused by the session service itself; the two ids."""
    commands = CommandClient(platform.nc, platform.topology)
    before, late = new_id(), new_id()
    await commands.send(command(before), actor="system:toolbroker")
    await platform.store.append_next(
        a.world.session_id,
        [ActivationCancelRequested(activation_id=a.activation_id, reason="stopped")],
        EventMeta(actor="system:scheduler"),
    )
    with pytest.raises(ForbiddenError, match="cancelled"):
        await commands.send(command(late), actor="system:toolbroker")
    return before, late


async def test_history_from_a_cancelled_activation_is_refused_by_the_session_itself(
    platform: Stack,
) -> None:
    """The race the broker's check cannot close alone: a cancel stored after the broker let a
    history call through but before the session appends it. The session service re-checks
    on the state its append is conditional on, so the late entry is refused, not stored."""
    a = await live(platform, "rhea")
    commands = CommandClient(platform.nc, platform.topology)

    def entry(message_id: str) -> AppendHistory:
        return AppendHistory(
            session_id=a.world.session_id,
            activation_id=a.activation_id,
            agent_id=a.world.agent_id,
            entries=(HistoryEntry(message_id=message_id, role="assistant", text="hi"),),
        )

    before, late = await refused_after_a_cancel(platform, a, entry)
    await commands.send(entry(before), actor="system:toolbroker")  # a retry: harmless
    stream = await platform.store.load("session", a.world.session_id)
    written = [
        e.data.message_id for e in stream.events if isinstance(e.data, SessionMessageAppended)
    ]
    assert before in written
    assert late not in written


async def test_work_a_cancelled_activation_queues_for_itself_is_refused_by_the_session(
    platform: Stack,
) -> None:
    """The same race for `signal.record` (and a message to its own session): a call the
    broker let through before a cancel was stored must not queue work after it — the next
    activation would do what the user had just stopped."""
    a = await live(platform, "orin")

    def signal(signal_id: str) -> RecordSignal:
        return RecordSignal(
            session_id=a.world.session_id,
            signal_id=signal_id,
            payload={"kind": "reminder"},
            activation_id=a.activation_id,
        )

    before, late = await refused_after_a_cancel(platform, a, signal)
    stream = await platform.store.load("session", a.world.session_id)
    recorded = [e.data.signal_id for e in stream.events if isinstance(e.data, SignalRecorded)]
    assert before in recorded
    assert late not in recorded


async def test_an_attempt_that_lives_on_after_the_next_was_requested_writes_nothing(
    platform: Stack,
) -> None:
    """The scheduler requests a session's next activation only once the last one ended. An
    attempt whose end was recorded (failed: its worker lost, its time up) while its sandbox
    lives on must not write among its successor's entries — not through the broker, whose
    fold may not show its end yet (that is on the activation's own subject), nor through a
    call the broker let in before the next one was requested."""
    a = await live(platform, "lazarus")
    commands = CommandClient(platform.nc, platform.topology)

    def entry(activation_id: str, message_id: str) -> AppendHistory:
        return AppendHistory(
            session_id=a.world.session_id,
            activation_id=activation_id,
            agent_id=a.world.agent_id,
            entries=(HistoryEntry(message_id=message_id, role="assistant", text="hi"),),
        )

    before, late, successors = new_id(), new_id(), new_id()
    await commands.send(entry(a.activation_id, before), actor="system:toolbroker")
    successor = await request_activation(platform, a.world)  # its end not even recorded

    with pytest.raises(ForbiddenError, match="later one"):
        await commands.send(entry(a.activation_id, late), actor="system:toolbroker")
    await commands.send(entry(a.activation_id, before), actor="system:toolbroker")  # a retry
    await commands.send(entry(successor, successors), actor="system:toolbroker")
    async with broker(platform, a.token) as c:
        refused = await c.post("/runner/tool-calls/start", json=start_body())
    assert refused.status_code == 403, refused.text
    assert refused.json()["code"] == "fenced"
    async with broker(platform, mint(platform, a.world, successor)) as c:
        allowed = await c.post("/runner/tool-calls/start", json=start_body())
    assert allowed.status_code == 200, allowed.text

    stream = await platform.store.load("session", a.world.session_id)
    written = [
        e.data.message_id for e in stream.events if isinstance(e.data, SessionMessageAppended)
    ]
    assert written[-2:] == [before, successors]
    assert late not in written
    assert await activation_types(platform, a.activation_id) == []


async def test_an_ended_activation_can_no_longer_act(platform: Stack) -> None:
    a = await live(platform, "endo")
    await platform.store.append_next(
        a.activation_id, [ActivationCompleted(text="done")], EventMeta(actor="system:orchestrator")
    )
    async with broker(platform, a.token) as c:
        response = await c.post("/runner/tool-calls/start", json=start_body())
    assert response.status_code == 403
    assert await activation_types(platform, a.activation_id) == ["activation.completed"]


async def test_the_broker_writes_on_what_it_folded_without_reading_the_activation(
    platform: Stack,
) -> None:
    """The orchestrator's `started` folded, the broker's first write goes on top of it with no
    read of the activation's subject; a write it has not folded yet is found on conflict."""
    a = await live(platform, "verso")
    meta = ORCHESTRATOR
    await platform.store.append(a.activation_id, [started(a)], 0, meta)
    marker = SessionMessageAppended(
        message_id=new_id(),
        author=Author(kind="agent", id=a.world.agent_id),
        role="assistant",
        text="marker",
        activation_id=a.activation_id,
    )
    await platform.store.append_next(a.world.session_id, [marker], meta)  # after it on the
    # session: the broker's check before the call waits until it folded the session this far,
    # so `started` too
    subject = platform.topology.event_subject("activation", a.activation_id)
    reads: list[str] = []

    async def on_get(msg: Msg) -> None:
        if msg.subject.endswith(subject) or subject.encode() in msg.data:
            reads.append(msg.subject)

    spy = await platform.nc.subscribe("$JS.API.DIRECT.GET.>", cb=on_get)
    try:
        async with broker(platform, a.token) as c:
            assert (await c.post("/runner/tool-calls/start", json=start_body())).json() == {
                "recorded": True
            }
            await platform.nc.flush()
            assert reads == []
            # Another replica's write the broker may not have folded yet: its conflict is seen.
            await platform.store.append(
                a.activation_id, [ToolCallStarted(**start_body("call-2"))], 2, meta
            )
            finish = {"call_id": "call-1", "status": "ok", "duration_ms": 1, "result_size": 0}
            assert (await c.post("/runner/tool-calls/finish", json=finish)).status_code == 200
    finally:
        await spy.unsubscribe()
    stream = await platform.store.load("activation", a.activation_id)
    assert [(e.version, e.envelope.type) for e in stream.events] == [
        (1, "activation.started"),
        (2, "activation.tool_call_started"),
        (3, "activation.tool_call_started"),
        (4, "activation.tool_call_finished"),
    ]


async def test_an_end_the_broker_cannot_read_is_never_written_past(
    nats_url: str, postgres_url: str, tmp_path: Path
) -> None:
    """An end written by a newer release (a schema this broker does not know) fails the
    broker's fold, so its version is not one the broker writes on: nothing lands after it.
    (A platform of its own: the projector rightly stops at that end.)"""
    services = ("session", "toolbroker", "gateway")
    async with running_stack(nats_url, postgres_url, tmp_path, services) as platform:
        await _never_past_an_unreadable_end(platform)


async def _never_past_an_unreadable_end(platform: Stack) -> None:
    a = await live(platform, "skew")
    meta = ORCHESTRATOR
    await platform.store.append(a.activation_id, [started(a)], 0, meta)
    async with broker(platform, a.token) as c:
        assert (await c.post("/runner/tool-calls/start", json=start_body())).status_code == 200
        ended = await platform.store.prepare(
            a.activation_id, [ActivationCompleted(text="done")], 2, meta
        )
        assert b'"schema":1' in ended.payload
        await platform.store.commit(
            replace(ended, payload=ended.payload.replace(b'"schema":1', b'"schema":99'))
        )
        await request_activation(platform, a.world)  # the broker's check waits past the end
        finish = {"call_id": "call-1", "status": "ok", "duration_ms": 1, "result_size": 0}
        response = await c.post("/runner/tool-calls/finish", json=finish)
    assert response.status_code >= 400
    subject = platform.topology.event_subject("activation", a.activation_id)
    info = await platform.nc.jetstream().stream_info(
        platform.topology.events_stream, subjects_filter=subject
    )
    assert (info.state.subjects or {}).get(subject) == 3  # started, the call, the end


async def test_another_activations_token_cannot_write_to_this_one(platform: Stack) -> None:
    mine = await live(platform, "mina")
    theirs = await live(platform, "thea")
    async with broker(platform, theirs.token) as c:
        await c.post("/runner/tool-calls/start", json=start_body())
    # Their call landed on their activation; mine is untouched.
    assert await activation_types(platform, mine.activation_id) == []
    assert await activation_types(platform, theirs.activation_id) == [
        "activation.tool_call_started"
    ]


async def test_toolpack_operations_outside_the_allowlist_are_refused(platform: Stack) -> None:
    a = await live(platform, "olga")
    async with broker(platform, a.token) as c:
        unknown = await c.post(
            "/toolpacks/core/support",
            json={"operation": "session.delete", "arguments": {}, "request_id": "r1"},
        )
        assert unknown.status_code == 403
        not_enabled = await c.post(
            "/toolpacks/files/support",
            json={"operation": "anything", "arguments": {}, "request_id": "r2"},
        )
        assert not_enabled.status_code == 403
        allowed = await c.post(
            "/toolpacks/core/support",
            json={
                "operation": "signal.record",
                "arguments": {"kind": "reminder"},
                "request_id": "r3",
            },
        )
        assert allowed.status_code == 200, allowed.text
        retried = await c.post(
            "/toolpacks/core/support",
            json={
                "operation": "signal.record",
                "arguments": {"kind": "reminder"},
                "request_id": "r3",
            },
        )
        assert retried.json() == allowed.json()

    async def signals() -> list[str]:
        stream = await platform.store.load("session", a.world.session_id)
        return [
            e.envelope.type for e in stream.events if e.envelope.type.endswith("signal_recorded")
        ]

    await eventually(signals, lambda s: len(s) == 1, what="one recorded signal")


async def test_live_chunks_reach_the_session_stream(platform: Stack) -> None:
    a = await live(platform, "lia")
    js = platform.nc.jetstream()
    sub = await js.subscribe(
        platform.topology.live_subject(a.world.session_id), ordered_consumer=True
    )
    async with broker(platform, a.token) as c:
        response = await c.post(
            "/runner/stream",
            json={"chunks": [{"kind": "text", "text": "Hel"}, {"kind": "text", "text": "lo"}]},
        )
        assert response.status_code == 200
    texts = [(await sub.next_msg(timeout=5)).data for _ in range(2)]
    assert [b'"Hel"' in texts[0], b'"lo"' in texts[1]] == [True, True]
    await sub.unsubscribe()


async def test_a_numbered_batch_sent_again_is_published_once(platform: Stack) -> None:
    """A runner's retry after a lost reply repeats its batch (same number): the session's
    stream carries its chunks once. The next number is new output."""
    a = await live(platform, "bea")
    sub = await platform.nc.jetstream().subscribe(
        platform.topology.live_subject(a.world.session_id), ordered_consumer=True
    )
    first = {
        "batch": 0,
        "chunks": [{"kind": "text", "text": "Hel"}, {"kind": "text", "text": "lo"}],
    }
    second = {"batch": 1, "chunks": [{"kind": "text", "text": "Hel"}]}
    async with broker(platform, a.token) as c:
        for body in (first, first, second, first):
            assert (await c.post("/runner/stream", json=body)).status_code == 200
    texts = [(await sub.next_msg(timeout=5)).data for _ in range(3)]
    assert [b'"Hel"' in texts[0], b'"lo"' in texts[1], b'"Hel"' in texts[2]] == [True] * 3
    with pytest.raises(nats.errors.TimeoutError):
        await sub.next_msg(timeout=0.5)
    await sub.unsubscribe()


async def test_a_final_call_streams_appends_then_records_and_sent_again_repeats_nothing(
    platform: Stack,
) -> None:
    """The runner's last call brings its last live batch and history entry: the chunks reach
    the session's stream, the entry is in the history before the output is recorded, and the
    same call sent again (a lost reply) adds nothing."""
    a = await live(platform, "fin")
    sub = await platform.nc.jetstream().subscribe(
        platform.topology.live_subject(a.world.session_id), ordered_consumer=True
    )
    entry_id = new_id()
    body = {
        "text": "done",
        "history": [{"message_id": entry_id, "role": "assistant", "text": "done"}],
        "live": {"batch": 0, "chunks": [{"kind": "text", "text": "do"}]},
    }
    async with broker(platform, a.token) as c:
        first = await c.post("/activation-output", json=body)
        again = await c.post("/activation-output", json=body)
    assert (first.json(), again.json()) == ({"recorded": True}, {"recorded": False})
    assert b'"do"' in (await sub.next_msg(timeout=5)).data
    with pytest.raises(nats.errors.TimeoutError):
        await sub.next_msg(timeout=0.5)
    await sub.unsubscribe()

    session = await platform.store.load("session", a.world.session_id)
    appended = [
        (e.seq, e.data.message_id)
        for e in session.events
        if isinstance(e.data, SessionMessageAppended)
    ]
    assert [message_id for _, message_id in appended] == [entry_id]
    output = await platform.store.load("activation", a.activation_id)
    (recorded,) = [e for e in output.events if e.envelope.type == "activation.output_recorded"]
    assert appended[0][0] < recorded.seq  # the history first, as the separate calls did


async def test_a_final_call_whose_live_batch_cannot_be_published_still_records(
    platform: Stack,
) -> None:
    """Live output is best-effort: with the LIVE stream gone (a NATS restart lost the memory
    stream), the final call still appends the history entry and records the output."""
    a = await live(platform, "nolive")
    entry_id = new_id()
    body = {
        "text": "done",
        "history": [{"message_id": entry_id, "role": "assistant", "text": "done"}],
        "live": {"batch": 0, "chunks": [{"kind": "text", "text": "do"}]},
    }
    await platform.nc.jetstream().delete_stream(platform.topology.live_stream)
    try:
        async with broker(platform, a.token) as c:
            response = await c.post("/activation-output", json=body)
    finally:
        await ensure_streams(platform.nc, platform.topology.streams())
    assert (response.status_code, response.json()) == (200, {"recorded": True})
    session = await platform.store.load("session", a.world.session_id)
    assert entry_id in [
        e.data.message_id for e in session.events if isinstance(e.data, SessionMessageAppended)
    ]
    assert "activation.output_recorded" in await activation_types(platform, a.activation_id)


async def test_checkpoints_are_stored_and_the_latest_is_returned(platform: Stack) -> None:
    a = await live(platform, "kit")
    async with broker(platform, a.token) as c:
        assert (await c.get("/runner/checkpoint")).status_code == 204
        for step in (1, 2):
            body = {"checkpoint_id": new_id(), "data": {"step": step}}
            assert (await c.put("/runner/checkpoint", json=body)).status_code == 200
        latest = await c.get("/runner/checkpoint")
        assert latest.json()["data"] == {"step": 2}
        too_big = {"checkpoint_id": new_id(), "data": {"blob": "x" * 300_000}}
        assert (await c.put("/runner/checkpoint", json=too_big)).status_code == 413


async def test_agents_cannot_forge_platform_signals_or_preempt(platform: Stack) -> None:
    a = await live(platform, "fora")
    forged = {"kind": "approval.result", "payload": {"pending_action_id": "x", "approved": True}}
    async with broker(platform, a.token) as c:
        p0 = await c.post(
            "/toolpacks/core/support",
            json={
                "operation": "signal.record",
                "arguments": {**forged, "priority": "P0"},
                "request_id": "p0",
            },
        )
        assert p0.status_code == 422
        recorded = await c.post(
            "/toolpacks/core/support",
            json={"operation": "signal.record", "arguments": forged, "request_id": "f1"},
        )
        assert recorded.status_code == 200, recorded.text
    stream = await platform.store.load("session", a.world.session_id)
    [signal] = [e.data for e in stream.events if e.envelope.type == "session.signal_recorded"]
    assert signal.kind == "custom"  # type: ignore[attr-defined]
    assert signal.payload == {"approved": True, "kind": "approval.result", "toolpack": "core"}  # type: ignore[attr-defined]


async def test_asking_under_another_sessions_id_asks_in_ones_own(platform: Stack) -> None:
    """The same id asked from two sessions is two questions, each its session's: neither
    sees the other's (its prompt, its answer)."""
    mine = await live(platform, "asko")
    theirs = await live(platform, "askt")
    action_id = new_id()
    body = {"pending_action_id": action_id, "prompt": "secret question?", "wait_seconds": 0}
    async with broker(platform, theirs.token) as c:
        asked = (await c.post("/runner/ask", json=body)).json()
        assert asked["status"] == "pending"
        # Asked again (a retry): the same pending action.
        assert (await c.post("/runner/ask", json=body)).json() == asked
    async with broker(platform, mine.token) as c:
        peek = (await c.post("/runner/ask", json={**body, "prompt": "peek"})).json()
    assert peek["status"] == "pending"
    assert peek["pending_action_id"] != asked["pending_action_id"]
    for session, answer in ((theirs, asked), (mine, peek)):
        stream = await platform.store.load("pending_action", answer["pending_action_id"])
        created = stream.events[0].data
        assert isinstance(created, PendingActionCreated)
        assert created.session_id == session.world.session_id
    prompts = await platform.store.load("pending_action", asked["pending_action_id"])
    assert prompts.events[0].data.prompt == "secret question?"  # type: ignore[attr-defined]


async def test_a_question_cannot_take_the_id_of_another_sessions_approval(
    platform: Stack,
) -> None:
    """An approval's id derives from its session, tool and arguments: anyone who knows them can
    compute it. A question asked under it from another session must not take it, or that call
    could never be approved there (its ask a 404)."""
    victim = await live(platform, "sqv")
    squatter = await live(platform, "sqs")
    written = '{"text": "deploy"}'
    pending = approval_id(victim.world.session_id, "message.send", arguments_digest(written), 0)
    async with broker(platform, squatter.token) as c:
        body = {"pending_action_id": pending, "prompt": "mine now?", "wait_seconds": 0}
        taken = await c.post("/runner/ask", json=body)
    assert taken.status_code == 200, taken.text
    assert taken.json()["pending_action_id"] != pending
    approval = {
        "pending_action_id": pending,
        "kind": "approval",
        "prompt": "-",
        "tool": "message.send",
        "approved_call": written,
        "wait_seconds": 0,
    }
    async with broker(platform, victim.token) as c:
        asked = await c.post("/runner/ask", json=approval)
    assert asked.status_code == 200, asked.text
    assert asked.json() == {**asked.json(), "pending_action_id": pending, "status": "pending"}
    created = (await platform.store.load("pending_action", pending)).events[0].data
    assert isinstance(created, PendingActionCreated)
    assert created.session_id == victim.world.session_id
    assert created.kind is PendingKind.APPROVAL


async def test_a_question_asked_under_the_runners_own_id_is_found_there(
    platform: Stack,
) -> None:
    """A question of this session stored under the id the runner asked with (as a broker of
    the previous release stored it): asked again, that one — not a second question."""
    a = await live(platform, "sqo")
    action_id = new_id()
    await CommandClient(platform.nc, platform.topology).send(
        CreatePendingAction(
            pending_action_id=action_id,
            session_id=a.world.session_id,
            activation_id=a.activation_id,
            kind=PendingKind.QUESTION,
            prompt="asked before the upgrade?",
        ),
        actor="system:toolbroker",
    )
    body = {"pending_action_id": action_id, "prompt": "asked before the upgrade?"}
    async with broker(platform, a.token) as c:
        again = await c.post("/runner/ask", json=body)
    assert again.status_code == 200, again.text
    assert again.json()["pending_action_id"] == action_id
    assert again.json()["status"] == "pending"


async def test_one_call_id_messaging_two_sessions_sends_two_messages(platform: Stack) -> None:
    a = await live(platform, "twom")
    async with platform.client(a.world.key) as c:
        other = await c.post(
            f"/v1/projects/{a.world.project_id}/sessions",
            json={"agent_id": a.world.agent_id, "title": "the other"},
        )
        assert other.status_code == 201, other.text
    targets = (a.world.session_id, other.json()["id"])
    sent = []
    async with broker(platform, a.token) as c:
        for session_id in targets:
            body = {
                "operation": "message.send",
                "arguments": {"session_id": session_id, "text": f"to {session_id}"},
                "request_id": "call_0",  # a provider that numbers its calls the same each time
            }
            response = await c.post("/toolpacks/core/support", json=body)
            assert response.status_code == 200, response.text
            sent.append(response.json()["result"]["message_id"])
    assert sent[0] != sent[1]  # neither is taken for a retry of the other
    for session_id, message_id in zip(targets, sent, strict=True):
        stream = await platform.store.load("session", session_id)
        texts = {
            e.data.message_id: e.data.text
            for e in stream.events
            if isinstance(e.data, SessionMessageAppended)
        }
        assert texts.get(message_id) == f"to {session_id}"
