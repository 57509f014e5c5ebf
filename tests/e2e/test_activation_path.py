"""The whole path on the process backend: a message through the gateway → signal → scheduler →
orchestrator → runner (against a scripted model: a fake provider through the real `openai`
SDK) → tool-broker → the answer streams to an SSE client and lands in the session's history,
and the activation's events tell its whole story. All services are real processes."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import pytest_asyncio

from suzumio.contracts.events import ActivationRequested
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from tests.e2e.api import World, new_world, on_backend, upload_artifact
from tests.e2e.runner_env import post
from tests.e2e.stack import Stack, running_stack
from tests.support import eventually, start_pool_worker

SERVICES = ("session", "scheduler", "orchestrator", "toolbroker", "gateway")


@pytest_asyncio.fixture(scope="module")
async def scripted() -> AsyncIterator[ScriptedModelServer]:
    async with ScriptedModelServer() as server:
        yield server


@pytest_asyncio.fixture(scope="module")
async def everything(
    nats_url: str,
    postgres_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    scripted: ScriptedModelServer,
) -> AsyncIterator[Stack]:
    tmp = Path(tmp_path_factory.mktemp("everything"))
    env = {
        "SUZUMIO_MODEL_BASE_URL": f"{scripted.url}/v1",
        "SUZUMIO_MODEL_API_KEY": "sk-e2e-secret",
        "SUZUMIO_BACKENDS": '["process", "docker", "pool"]',
    }
    async with running_stack(nats_url, postgres_url, tmp, SERVICES, env) as stack:
        worker = start_pool_worker(
            stack.nats_url, stack.topology.namespace, tmp / "worker", tmp / "worker.log"
        )
        try:
            yield stack
        finally:
            worker.terminate()
            worker.wait(30)


async def sse_texts(stack: Stack, world: World, texts: list[str], ready: asyncio.Event) -> None:
    url = urlsplit(stack.api)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    writer.write(
        (
            f"GET /v1/sessions/{world.session_id}/stream HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {world.key}\r\n\r\n"
        ).encode()
    )
    try:
        while line := await reader.readline():
            if line.startswith(b"retry:"):
                ready.set()
            if line.startswith(b"data: ") and b'"kind":"text"' in line:
                texts.append(json.loads(line[6:])["text"])
    finally:
        writer.close()


async def story(stack: Stack, activation_id: str) -> list[str]:
    stream = await stack.store.load("activation", activation_id)
    return [e.envelope.type for e in stream.events]


@pytest.mark.parametrize("backend", ["process", "docker", "pool"])
async def test_a_message_is_answered_through_the_whole_platform(
    everything: Stack, scripted: ScriptedModelServer, backend: str
) -> None:
    world = await new_world(everything, f"wren{backend}")
    await on_backend(everything, world, backend)
    scripted.script(
        [
            Reply.tool_calls(
                [ToolCall("file_write", {"path": "out/summary.txt", "content": "all good"})]
            ),
            Reply.text("I saved the summary as summary.txt."),
        ]
    )
    texts: list[str] = []
    ready = asyncio.Event()
    reader = asyncio.create_task(sse_texts(everything, world, texts, ready))
    await asyncio.wait_for(ready.wait(), 30)
    await post(everything, world, "summarise, please")

    async def requested() -> list[str]:
        stream = await everything.store.load("session", world.session_id)
        return [
            e.data.activation_id for e in stream.events if isinstance(e.data, ActivationRequested)
        ]

    [activation_id] = await eventually(requested, lambda ids: len(ids) == 1, what="a request")
    events = await eventually(
        lambda: story(everything, activation_id),
        lambda types: "activation.completed" in types or "activation.failed" in types,
        timeout=60,
        what="the activation's end",
    )
    assert events == [
        "activation.started",
        "activation.tool_call_started",
        "activation.tool_call_finished",
        "activation.output_recorded",
        "activation.completed",
    ], events
    await eventually(
        lambda: asyncio.sleep(0, "".join(texts)),
        lambda streamed: "I saved the summary as summary.txt." in streamed,
        timeout=30,
        what="the answer on the SSE stream",
    )
    reader.cancel()
    async with everything.client(world.key) as c:
        messages = await eventually(
            lambda: c.get(f"/v1/sessions/{world.session_id}/messages"),
            lambda r: any(
                m.get("text") == "I saved the summary as summary.txt." for m in r.json()["items"]
            ),
            what="the answer in the history",
        )
        assert messages.status_code == 200
        artifacts = await eventually(
            lambda: c.get(f"/v1/projects/{world.project_id}/artifacts"),
            lambda r: any(a["path"] == "summary.txt" for a in r.json()["items"]),
            what="the out/ file as an artifact",
        )
        [artifact] = [a for a in artifacts.json()["items"] if a["path"] == "summary.txt"]
        assert artifact["source"] == "activation"
        assert artifact["sha256"] == hashlib.sha256(b"all good").hexdigest()
    # The provider key went to the model, never into the log.
    assert scripted.requests[-1].headers["authorization"] == "Bearer sk-e2e-secret"
    for aggregate, ident in (("activation", activation_id), ("session", world.session_id)):
        stream = await everything.store.load(aggregate, ident)
        assert "sk-e2e-secret" not in str([e.envelope.model_dump() for e in stream.events])


@pytest.mark.parametrize("backend", ["process", "docker", "pool"])
async def test_the_sessions_artifacts_are_in_the_next_activations_inputs(
    everything: Stack, scripted: ScriptedModelServer, backend: str
) -> None:
    """Files uploaded to the session are in `/workspace/in` (for the pool: brought from the
    object store by the worker), at their paths, byte for byte."""
    world = await new_world(everything, f"ibis{backend}")
    await on_backend(everything, world, backend)
    await upload_artifact(everything, world, "notes/brief.md", b"# the brief: ship it\n")
    scripted.script(
        [
            Reply.tool_calls([ToolCall("file_read", {"path": "in/notes/brief.md"})]),
            Reply.text("read it"),
        ]
    )
    seen = len(scripted.requests)
    await post(everything, world, "read the brief")

    def tool_results() -> list[str]:
        return [
            str(m.get("content"))
            for r in scripted.requests[seen:]
            if world.session_id in str(r.messages[0])
            for m in r.messages
            if m.get("role") == "tool"
        ]

    results = await eventually(
        lambda: asyncio.sleep(0, tool_results()), bool, timeout=60, what="the tool result"
    )
    assert "# the brief: ship it" in results[0], results


def model_calls(scripted: ScriptedModelServer, world: World) -> int:
    """The model calls made for the world's session (its id is in the system prompt)."""
    return sum(world.session_id in str(r.messages[0]) for r in scripted.requests if r.messages)


async def test_cancelling_a_running_activation_kills_its_sandbox(
    everything: Stack, scripted: ScriptedModelServer
) -> None:
    world = await new_world(everything, "cato")
    scripted.script(
        [Reply.text("too slow", delay=30), Reply.text("new plan: done"), Reply.text("and that")]
    )
    await post(everything, world, "take your time")

    async def live_activation() -> list[str]:
        stream = await everything.store.load("session", world.session_id)
        return [
            e.data.activation_id for e in stream.events if isinstance(e.data, ActivationRequested)
        ]

    [activation_id] = await eventually(live_activation, lambda ids: len(ids) == 1, what="request")
    await eventually(
        lambda: story(everything, activation_id),
        lambda types: "activation.started" in types,
        timeout=30,
        what="the start",
    )
    # Cancelled only once its runner waits in the slow model call: cancelled any earlier, the
    # replacement would take the slow reply itself (and wait it out).
    await eventually(
        lambda: asyncio.sleep(0, model_calls(scripted, world)),
        lambda n: n >= 1,
        timeout=30,
        what="the runner calling the model",
    )
    # A P0 message replaces the live activation: the scheduler asks to cancel it.
    await post(everything, world, "stop, new plan", priority="P0")
    types = await eventually(
        lambda: story(everything, activation_id),
        lambda t: "activation.cancelled" in t,
        timeout=30,
        what="the cancellation",
    )
    assert types.count("activation.cancelled") == 1
    assert not [t for t in types if t in {"activation.completed", "activation.failed"}]

    # The scheduler stored the cancel, the replacing request and its delivery as one message;
    # the replacement runs, and the session's next message is planned on from there.
    ids = await eventually(live_activation, lambda ids: len(ids) == 2, what="the replacement")
    ended = {"activation.completed", "activation.failed"}
    replaced = await eventually(
        lambda: story(everything, ids[1]), lambda t: bool(ended & set(t)), timeout=60
    )
    assert "activation.completed" in replaced, replaced
    # Cancel, then start: the replacement's sandbox started once the replaced one had ended
    # (not beside it, on the session's directory, for the stop's grace).
    old_events = (await everything.store.load("activation", ids[0])).events
    new_events = (await everything.store.load("activation", ids[1])).events
    [cancelled] = [e for e in old_events if e.envelope.type == "activation.cancelled"]
    [started] = [e for e in new_events if e.envelope.type == "activation.started"]
    assert started.envelope.occurred_at >= cancelled.envelope.occurred_at
    await post(everything, world, "one more thing")
    ids = await eventually(live_activation, lambda ids: len(ids) == 3, what="the next request")
    after = await eventually(
        lambda: story(everything, ids[2]), lambda t: bool(ended & set(t)), timeout=60
    )
    assert "activation.completed" in after, after


async def test_cluster_status_reports_each_backends_health(everything: Stack) -> None:
    async with everything.client(everything.admin_key) as c:
        status = await eventually(
            lambda: c.get("/v1/cluster/status"),
            lambda r: any(
                b.get("name") == "process" and b.get("leading")
                for b in r.json().get("backends", [])
            ),
            timeout=30,
            what="the process backend's health",
        )
    [process] = [b for b in status.json()["backends"] if b["name"] == "process" and b["leading"]]
    assert process["ok"] is True, process
    assert process["leading"] is True
    assert process["isolation"] in {"bwrap", "none"}
