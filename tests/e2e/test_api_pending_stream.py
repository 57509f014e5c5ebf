"""Pending actions (answer, expiry) and the live stream (SSE and WebSocket)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import datetime
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from suzumio.contracts.commands import CreatePendingAction
from suzumio.contracts.events import PendingActionAnswered
from suzumio.contracts.ids import new_id
from suzumio.contracts.values import PendingKind
from suzumio.platform.bus.commands import CommandClient
from tests.e2e.api import World, in_pages, new_user, new_world, ok, problem, publish_chunk
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
            lambda r: r.status_code == 200 and len(r.json()["items"]) == 1,
            what="the pending action",
        )
        assert listed.json()["items"][0]["status"] == "open"
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


async def test_a_sessions_pending_actions_come_a_page_at_a_time_and_by_status(
    stack: Stack,
) -> None:
    """Nothing bounds a session's pending actions: the list was one unbounded answer, built
    on the event loop. Paged (oldest first), and `status=open` gives what the agent waits on."""
    world = await new_world(stack, "pgd")
    ids = [await ask(stack, world, PendingKind.QUESTION) for _ in range(3)]
    url = f"/v1/sessions/{world.session_id}/pending-actions"
    async with stack.client(world.key) as c:
        assert [a["id"] for a in await in_pages(c, url, 3)] == ids
        ok(await c.post(f"/v1/pending-actions/{ids[1]}/reply", json={"answer": "done"}))
        still = await eventually(
            lambda: c.get(url, params={"status": "open"}),
            lambda r: r.status_code == 200 and len(r.json()["items"]) == 2,
            what="the answer in the read model",
        )
        assert [a["id"] for a in still.json()["items"]] == [ids[0], ids[2]]
        problem(await c.get(url, params={"status": "maybe"}), 422, "invalid")


async def test_an_answer_to_a_closed_sessions_question_is_refused_until_it_is_reopened(
    stack: Stack,
) -> None:
    """A closed session starts no activation: an answer given then would wait unseen for a
    reopen. It is a 409 while the session is closed (said while the person is there), and
    taken (and its agent woken) once it is reopened."""
    world = await new_world(stack, "clo")
    action_id = await ask(stack, world, PendingKind.QUESTION)
    reply = f"/v1/pending-actions/{action_id}/reply"
    async with stack.client(world.key) as c:
        ok(await c.post(f"/v1/sessions/{world.session_id}/close", json={"reason": "done"}))
        refused = problem(await c.post(reply, json={"answer": "later"}), 409, "conflict")
        assert "closed" in refused["detail"]
        ok(await c.post(f"/v1/sessions/{world.session_id}/reopen"))
        assert ok(await c.post(reply, json={"answer": "now"}))["status"] == "answered"
        signals = ok(await c.get(f"/v1/sessions/{world.session_id}/signals"))["items"]
        wake = [s for s in signals if s["payload"].get("pending_action_id") == action_id]
        assert [s["payload"]["answer"] for s in wake] == ["now"]


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
        # The wake-up signal is a second append, right after the outcome: wait for it too.
        signals = await eventually(
            lambda: c.get(f"/v1/sessions/{world.session_id}/signals"),
            lambda r: any("pending_action_id" in s["payload"] for s in r.json()["items"]),
            what="the wake-up signal",
        )
        assert [
            s["payload"]["outcome"]
            for s in signals.json()["items"]
            if "pending_action_id" in s["payload"]
        ] == ["expired"]
        problem(
            await c.post(f"/v1/pending-actions/{action_id}/reply", json={"answer": "late"}),
            409,
            "conflict",
        )


async def test_outcome_whose_signal_was_never_recorded_is_caught_up(stack: Stack) -> None:
    """The session service may die between appending an answer and recording the signal
    that wakes the agent: the catch-up reaction records it from the log, exactly once."""
    world = await new_world(stack, "tess")
    action_id = await ask(stack, world, PendingKind.QUESTION)
    async with stack.client(world.key) as c:
        await eventually(
            lambda: c.get(f"/v1/pending-actions/{action_id}"),
            lambda r: r.status_code == 200,
            what="the pending action",
        )
        answered = PendingActionAnswered(answer="blue", answered_by=f"user:{world.user_id}")
        await stack.store.append(action_id, [answered], 1)  # the outcome, but no signal
        signals = await eventually(
            lambda: c.get(f"/v1/sessions/{world.session_id}/signals"),
            lambda r: any(
                s["payload"].get("pending_action_id") == action_id for s in r.json()["items"]
            ),
            what="the caught-up wake-up signal",
        )
        wake = [
            s for s in signals.json()["items"] if s["payload"].get("pending_action_id") == action_id
        ]
        assert [(w["priority"], w["payload"]["answer"]) for w in wake] == [("P1", "blue")]


async def test_handing_over_another_projects_artifact_is_refused(stack: Stack) -> None:
    world, other = await new_world(stack, "ursa"), await new_world(stack, "vic")
    async with stack.client(other.key) as c:
        foreign = ok(
            await c.post(
                f"/v1/projects/{other.project_id}/artifacts",
                files=[("file", ("secret.txt", b"theirs", "text/plain"))],
            ),
            201,
        )["items"][0]["id"]
    action_id = await ask(stack, world, PendingKind.ARTIFACT_REQUEST, paths=("report.pdf",))
    async with stack.client(world.key) as c:
        await eventually(
            lambda: c.get(f"/v1/pending-actions/{action_id}"),
            lambda r: r.status_code == 200,
            what="the pending action",
        )
        refused = problem(
            await c.post(
                f"/v1/pending-actions/{action_id}/reply", json={"artifact_ids": [foreign]}
            ),
            422,
            "invalid",
        )
        assert foreign in refused["detail"]
        own = ok(
            await c.post(
                f"/v1/projects/{world.project_id}/artifacts",
                files=[("file", ("report.pdf", b"%PDF-1.7", "application/pdf"))],
            ),
            201,
        )["items"][0]["id"]
        answered = ok(
            await c.post(f"/v1/pending-actions/{action_id}/reply", json={"artifact_ids": [own]})
        )
        assert (answered["status"], answered["artifact_ids"]) == ("answered", [own])


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


async def _consumers_on(stack: Stack, stream: str, subject: str) -> set[str]:
    infos = await stack.nc.jetstream().consumers_info(stream)
    return {i.name for i in infos if i.name and i.config.filter_subject == subject}


async def _lose_its_consumer(stack: Stack, stream: str, subject: str, others: set[str]) -> None:
    """Delete the consumer of `subject` a stream just made (not one of `others`), as a NATS
    restart loses it, and wait until nats-py made it again."""

    async def on_subject() -> set[str]:
        return await _consumers_on(stack, stream, subject)

    ours = await eventually(on_subject, lambda names: bool(names - others), what="its consumer")
    for name in ours - others:
        await stack.nc.jetstream().delete_consumer(stream, name)
    gone = ours | others
    await eventually(
        on_subject, lambda names: bool(names - gone), timeout=40, what="its consumer made again"
    )


async def test_a_resumed_stream_whose_consumers_are_lost_goes_on_from_its_cursor(
    stack: Stack,
) -> None:
    """nats-py makes an ordered consumer again (a NATS restart, a cluster node lost) from the
    last sequence it delivered, counted from 0: a stream resumed at the end of a quiet session
    was sent the session's whole log and live output again, as new items."""
    world = await new_world(stack, "ulla")
    url = f"/v1/sessions/{world.session_id}/stream"
    events = stack.topology.event_subject("session", world.session_id)
    live = stack.topology.live_subject(world.session_id)
    async with stack.client(world.key) as c:
        ok(await c.post(f"/v1/sessions/{world.session_id}/messages", json={"text": "hi"}), 201)
        async with c.stream("GET", url) as response:
            first = SseReader(response)
            seen = await first.read(3)
            await publish_chunk(stack, world, "old")
            seen += await first.read(1)
        assert [e["event"] for e in seen][-1] == "live"
        before = {
            stack.topology.events_stream: await _consumers_on(
                stack, stack.topology.events_stream, events
            ),
            stack.topology.live_stream: await _consumers_on(
                stack, stack.topology.live_stream, live
            ),
        }
        async with c.stream("GET", url, headers={"Last-Event-ID": seen[-1]["id"]}) as response:
            reader = SseReader(response)
            for stream, subject in (
                (stack.topology.events_stream, events),
                (stack.topology.live_stream, live),
            ):
                await _lose_its_consumer(stack, stream, subject, before[stream])
            await publish_chunk(stack, world, "new")
            ok(
                await c.post(f"/v1/sessions/{world.session_id}/messages", json={"text": "again"}),
                201,
            )
            after = await reader.read(3)
    assert [e["event"] for e in after] == [
        "live",
        "session.message_appended",
        "session.signal_recorded",
    ]
    assert json.loads(after[0]["data"])["text"] == "new"
    assert json.loads(after[1]["data"])["data"]["text"] == "again"


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
    # The cursor as the SSE stream takes it (and as docs/api.md says): `?since=` or the
    # `Last-Event-ID` header. Ignored before: the timeline came again from its start.
    await publish_chunk(stack, world, "later")
    cursor = chunk["id"]
    resumed = [
        ws_url + f"?access_token={world.key}&since={cursor}",
        (ws_url + f"?access_token={world.key}", {"Last-Event-ID": cursor}),
    ]
    for target in resumed:
        url, headers = target if isinstance(target, tuple) else (target, {})
        async with ws_connect(url, additional_headers=headers) as ws:
            first = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert (first["event"], first["data"]["text"]) == ("live", "later")


async def test_a_websocket_client_cannot_park_a_large_message_on_the_gateway(
    stack: Stack,
) -> None:
    """The stream only sends: what a client sends is never read, and uvicorn held one message
    of up to 16 MiB per socket for its life (32 sockets a user on each replica). A message
    past a few KiB now closes the socket (1009, too big)."""
    world = await new_world(stack, "wsz")
    ws_url = stack.api.replace("http", "ws") + f"/v1/sessions/{world.session_id}/ws"
    async with ws_connect(
        ws_url, additional_headers={"Authorization": f"Bearer {world.key}"}, max_size=None
    ) as ws:
        opened = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert opened["event"] == "session.opened"
        await ws.send("x" * (1 << 20))
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(drain(ws), 10)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1009


async def drain(ws: Any) -> None:
    """Read until the socket closes (ConnectionClosed)."""
    while True:
        await ws.recv()


async def test_streams_end_when_access_is_withdrawn(stack: Stack) -> None:
    """An open stream re-checks the caller: removing a member ends their SSE stream, and
    revoking a key ends its WebSocket, each with an `end` item saying why."""
    world = await new_world(stack, "wes")
    viewer_key, viewer_id = await new_user(stack, "xia")
    members = f"/v1/projects/{world.project_id}/members/{viewer_id}"
    url = f"/v1/sessions/{world.session_id}/stream"
    async with stack.client(world.key) as owner, stack.client(viewer_key) as viewer:
        ok(await owner.put(members, json={"role": "viewer"}))
        async with viewer.stream("GET", url) as response:
            reader = SseReader(response)
            assert (await reader.read(1))[0]["event"] == "session.opened"
            ok(await owner.delete(members), 204)
            [end] = await reader.read(1)
            assert (end["event"], json.loads(end["data"])["status"]) == ("end", 404)
            with pytest.raises(StopAsyncIteration):
                await reader.read(1)  # and the server closed the stream
        problem(await viewer.get(url), 404, "not_found")

        spare = ok(await owner.post("/v1/me/api-keys", json={"name": "spare"}), 201)
        ws_url = stack.api.replace("http", "ws") + f"/v1/sessions/{world.session_id}/ws"
        async with ws_connect(ws_url + f"?access_token={spare['api_key']}") as ws:
            opened = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert opened["event"] == "session.opened"
            ok(await owner.delete(f"/v1/me/api-keys/{spare['key_id']}"), 204)
            ended = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert (ended["event"], ended["data"]["status"]) == ("end", 401)
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 10)
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 4401


async def test_live_cursor_past_the_end_restarts_from_the_beginning(stack: Stack) -> None:
    """LIVE is kept in memory and numbers from 1 again after a server restart: a cursor
    from before that must not wait for a sequence that will never come."""
    world = await new_world(stack, "yan")
    url = f"/v1/sessions/{world.session_id}/stream"
    await publish_chunk(stack, world, "after restart")
    resume = {"Last-Event-ID": f"0.{2**62}"}
    async with stack.client(world.key) as c, c.stream("GET", url, headers=resume) as response:
        items = await SseReader(response).read(2)
    by_event = {e["event"]: e for e in items}  # the two streams interleave in no fixed order
    assert set(by_event) == {"session.opened", "live"}
    assert json.loads(by_event["live"]["data"])["text"] == "after restart"


async def test_streams_of_one_session_share_one_live_consumer_and_resume_exactly(
    stack: Stack,
) -> None:
    """Watchers of a session share the gateway's one LIVE consumer; a watcher resuming from a
    cursor while that consumer is already running gets what came after its cursor, no gap."""
    world = await new_world(stack, "zed")
    url = f"/v1/sessions/{world.session_id}/stream"
    async with stack.client(world.key) as a, stack.client(world.key) as b:
        async with a.stream("GET", url) as first, b.stream("GET", url) as second:
            readers = [SseReader(first), SseReader(second)]
            for reader in readers:
                await reader.read(1)  # session.opened
            consumers = await stack.nc.jetstream().consumers_info(stack.topology.live_stream)
            subject = stack.topology.live_subject(world.session_id)
            assert [c.config.filter_subject for c in consumers].count(subject) == 1
            for text in ("one", "two", "three"):
                await publish_chunk(stack, world, text)
            seen = await readers[0].read(3)
            assert [json.loads(e["data"])["text"] for e in seen] == ["one", "two", "three"]
            resume = {"Last-Event-ID": seen[0]["id"]}
            async with a.stream("GET", url, headers=resume) as third:
                again = await SseReader(third).read(2)
        assert [json.loads(e["data"])["text"] for e in again] == ["two", "three"]


async def test_one_user_may_hold_only_so_many_streams_open(stack: Stack) -> None:
    """`SUZUMIO_STREAM_MAX_PER_USER` (32) streams of one user on a gateway: one more is a
    429 problem before any stream starts, SSE and WebSocket alike; one closed gives its
    place back."""
    world = await new_world(stack, "cap")
    url = f"/v1/sessions/{world.session_id}/stream"
    async with contextlib.AsyncExitStack() as held, stack.client(world.key) as c:
        streams = []
        for _ in range(32):
            response = await held.enter_async_context(c.stream("GET", url))
            assert response.status_code == 200
            streams.append(response)
        refused = problem(await c.get(url), 429, "rate_limited")
        assert "at most 32 streams" in refused["detail"]
        ws_url = stack.api.replace("http", "ws") + f"/v1/sessions/{world.session_id}/ws"
        async with ws_connect(ws_url + f"?access_token={world.key}") as ws:
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 10)
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 4429
        await streams[0].aclose()

        async def reopened() -> bool:
            async with c.stream("GET", url) as again:
                return again.status_code == 200

        await eventually(reopened, bool, what="a stream's place given back")
