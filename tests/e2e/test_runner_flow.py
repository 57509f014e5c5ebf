"""The runner against a scripted model (a fake provider, through the real `openai` SDK) and
the real services — session, scheduler, tool-broker and gateway as processes. Activations are
launched as runner processes by the test launcher until the orchestrator exists."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Self

import pytest_asyncio

from suzumio.contracts.commands import AppendHistory, HistoryEntry
from suzumio.contracts.events import (
    ActivationCompleted,
    ActivationFailed,
    ActivationOutputRecorded,
    HistoryCompacted,
    SessionMessageAppended,
    ToolCallFinished,
    ToolCallStarted,
)
from suzumio.contracts.ids import new_id
from suzumio.contracts.runner import RunnerActivationInput, RunnerConfig, RunnerToolpackSpec
from suzumio.platform.bus.commands import CommandClient
from suzumio.runner import exits
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from tests.e2e.api import World, new_world
from tests.e2e.runner_env import launcher, post
from tests.e2e.stack import Stack
from tests.runner_support import Run


class SlowPages:
    """A local HTTP server whose pages answer after a delay given in the path (`/slow/0.8`),
    recording when each request arrived and when it was answered."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.answered: dict[str, float] = {}
        self.url = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = (await reader.readline()).decode()
        path = line.split(" ")[1]
        while (await reader.readline()) not in {b"\r\n", b""}:
            pass
        self.arrived[path] = time.monotonic()
        await asyncio.sleep(float(path.rsplit("/", 1)[-1]))
        body = f"page {path}".encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\nConnection: close\r\n\r\n"
            + body
        )
        self.answered[path] = time.monotonic()
        await writer.drain()
        writer.close()


@pytest_asyncio.fixture
async def pages() -> AsyncIterator[SlowPages]:
    async with SlowPages() as server:
        yield server


def local_network(spec: RunnerActivationInput) -> RunnerActivationInput:
    """The web toolpack on, and loopback reachable (the slow pages live there)."""
    packs = tuple(RunnerToolpackSpec(name=n) for n in ("files", "web"))
    return spec.model_copy(update={"allow_private_network": True, "toolpacks": packs})


async def activation_events(stack: Stack, run: Run) -> list[object]:
    return [e.data for e in (await stack.store.load("activation", run.activation_id)).events]


async def history(stack: Stack, world: World) -> list[SessionMessageAppended]:
    stream = await stack.store.load("session", world.session_id)
    return [e.data for e in stream.events if isinstance(e.data, SessionMessageAppended)]


async def one_run(stack: Stack, model: ScriptedModelServer, tmp: Path, text: str, **kw) -> Run:
    world = await new_world(stack, f"u{new_id()[-6:]}")
    async with launcher(stack, model, tmp, world, **kw) as runs:
        await post(stack, world, text)
        [run] = await runs.wait_ended(1)
    run.world = world  # type: ignore[attr-defined]
    return run


async def test_a_message_gets_an_answer_with_one_tool_call(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    model.script(
        [
            Reply.tool_calls([ToolCall("file_write", {"path": "notes.txt", "content": "hi"})]),
            Reply.text("I wrote notes.txt."),
        ]
    )
    run = await one_run(platform, model, tmp_path, "write a note")
    assert run.exit_code == exits.COMPLETED, run.stderr
    assert (tmp_path / run.activation_id / "workspace" / "notes.txt").read_text() == "hi"
    events = await activation_events(platform, run)
    started = [e for e in events if isinstance(e, ToolCallStarted)]
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert [s.tool for s in started] == ["file.write"]
    assert finished[0].status == "ok"
    assert finished[0].result_size > 0
    assert isinstance(events[-1], ActivationCompleted)
    output = next(e for e in events if isinstance(e, ActivationOutputRecorded))
    assert output.text == "I wrote notes.txt."
    assert output.usage["model_calls"] == 2
    entries = await history(platform, run.world)  # type: ignore[attr-defined]
    assert [e.role for e in entries] == ["user", "assistant", "tool", "assistant"]
    assert entries[1].tool_calls[0].name == "file.write"
    assert entries[2].tool_call_id == entries[1].tool_calls[0].id
    assert entries[-1].text == "I wrote notes.txt."
    # The prompt layers are built once: byte-identical across the activation's calls.
    assert model.requests[0].messages[0] == model.requests[1].messages[0]
    # The provider key reached the model server, never the log.
    assert model.requests[0].headers["authorization"] == "Bearer sk-test-key-never-logged"
    raw = await platform.store.load("session", run.world.session_id)  # type: ignore[attr-defined]
    assert "sk-test-key" not in str([e.envelope.model_dump() for e in raw.events])


async def test_reads_run_in_parallel_writes_wait_and_results_keep_call_order(
    platform: Stack, model: ScriptedModelServer, pages: SlowPages, tmp_path: Path
) -> None:
    model.script(
        [
            Reply.tool_calls(
                [
                    ToolCall("web_fetch", {"url": f"{pages.url}/a/0.9"}),
                    ToolCall("web_fetch", {"url": f"{pages.url}/b/0.3"}),
                    ToolCall("web_fetch", {"url": f"{pages.url}/c/0.6"}),
                    ToolCall("file_write", {"path": "out/report.txt", "content": "one"}),
                    ToolCall("file_write", {"path": "out", "content": "clash"}),
                    ToolCall("file_write", {"path": "out/report.txt", "content": "two"}),
                ]
            ),
            Reply.text("done"),
        ]
    )
    run = await one_run(platform, model, tmp_path, "fetch and write", customise=local_network)
    assert run.exit_code == exits.COMPLETED, run.stderr
    # All three reads were in flight together: each arrived before any was answered.
    assert max(pages.arrived.values()) < min(pages.answered.values())
    # The overlapping writes ran one after another, after the reads' segment.
    events = await activation_events(platform, run)
    order = [
        (type(e).__name__, e.call_id)
        for e in events
        if isinstance(e, ToolCallStarted | ToolCallFinished)
    ]
    calls = [c.id for c in (await history(platform, run.world))[1].tool_calls]  # type: ignore[attr-defined]
    w1, w2, w3 = calls[3], calls[4], calls[5]
    assert order.index(("ToolCallFinished", w1)) < order.index(("ToolCallStarted", w2))
    assert order.index(("ToolCallFinished", w2)) < order.index(("ToolCallStarted", w3))
    # The results went back to the model in call order, whatever order they finished in.
    second = model.requests[1].messages
    results = [m for m in second if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == calls
    assert "page /a/0.9" in results[0]["content"]
    assert "page /b/0.3" in results[1]["content"]
    assert (tmp_path / run.activation_id / "workspace" / "out" / "report.txt").read_text() == "two"


async def test_a_p1_message_is_injected_after_the_tool_round(
    platform: Stack, model: ScriptedModelServer, pages: SlowPages, tmp_path: Path
) -> None:
    world = await new_world(platform, "pia")
    model.script(
        [
            Reply.tool_calls([ToolCall("web_fetch", {"url": f"{pages.url}/slow/1.5"})]),
            Reply.text("noted both"),
        ]
    )
    async with launcher(platform, model, tmp_path, world, customise=local_network) as runs:
        await post(platform, world, "fetch the page")
        await model.wait_for_requests(1, timeout=30)
        for _ in range(500):
            if "/slow/1.5" in pages.arrived:
                break
            await asyncio.sleep(0.02)
        assert "/slow/1.5" in pages.arrived, "the tool round never fetched the page"
        await post(platform, world, "also: use British spelling")  # P1 by default
        [run] = await runs.wait_ended(1)
    assert run.exit_code == exits.COMPLETED, run.stderr
    assert len(runs.runs) == 1  # delivered to the live activation, not a new one
    second = model.requests[1].messages
    roles = [m["role"] for m in second]
    assert roles[-2:] == ["tool", "user"]
    assert second[-1]["content"] == "also: use British spelling"


async def test_context_overflow_compacts_archives_the_range_and_retries(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    world = await new_world(platform, "cora")
    earlier = [
        HistoryEntry(message_id=new_id(), role=role, text=f"{role} turn {i}: " + "x" * 300)
        for i in range(12)
        for role in ("user", "assistant")
    ]
    await CommandClient(platform.nc, platform.topology).send(
        AppendHistory(
            session_id=world.session_id,
            activation_id=new_id(),
            agent_id=world.agent_id,
            entries=tuple(earlier),
        ),
        actor="system:toolbroker",
    )
    model.script(
        [
            Reply.context_length_exceeded(),
            Reply.text("Goal: answer. Completed actions: 12 exchanges about x."),
            Reply.text("answered after compaction"),
        ]
    )
    async with launcher(platform, model, tmp_path, world) as runs:
        await post(platform, world, "and now?")
        [run] = await runs.wait_ended(1)
    assert run.exit_code == exits.COMPLETED, run.stderr
    first, summariser, retried = model.requests[:3]
    assert len(retried.messages) < len(first.messages)
    assert any("[Summary of earlier conversation]" in str(m["content"]) for m in retried.messages)
    assert "tools" not in summariser.json or not summariser.json["tools"]
    session = await platform.store.load("session", world.session_id)
    [marker] = [e.data for e in session.events if isinstance(e.data, HistoryCompacted)]
    # The head kept whole is the system prompt and the first exchange: the range starts after.
    assert marker.archived_from == earlier[2].message_id
    assert marker.archived_count >= 2
    assert marker.summary.startswith("Goal: answer")
    # The raw range is still in the log: archived, not deleted.
    texts = {e.data.text for e in session.events if isinstance(e.data, SessionMessageAppended)}
    assert all(e.text in texts for e in earlier)
    output = next(
        e for e in await activation_events(platform, run) if isinstance(e, ActivationOutputRecorded)
    )
    assert output.usage["model_calls"] == 1
    assert output.usage["compactions"] == 1


async def test_rate_limit_waits_for_retry_after_then_succeeds(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    model.script([Reply.rate_limited(retry_after=1), Reply.text("after the wait")])
    run = await one_run(platform, model, tmp_path, "hi")
    assert run.exit_code == exits.COMPLETED, run.stderr
    first, second = model.requests[:2]
    assert second.received_at - first.received_at >= 1.0  # Retry-After was honoured


async def test_server_error_is_retried(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    model.script([Reply.server_error(), Reply.text("second time lucky")])
    run = await one_run(platform, model, tmp_path, "hi")
    assert run.exit_code == exits.COMPLETED, run.stderr
    assert len(model.completion_requests) == 2


async def test_model_not_found_falls_back_to_the_next_model(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    model.script([Reply.model_not_found("primary")], model="primary")
    model.script([Reply.text("the backup answers")], model="backup")
    run = await one_run(platform, model, tmp_path, "hi", fallbacks=("backup",))
    assert run.exit_code == exits.COMPLETED, run.stderr
    assert [r.model for r in model.completion_requests] == ["primary", "backup"]
    output = next(
        e for e in await activation_events(platform, run) if isinstance(e, ActivationOutputRecorded)
    )
    assert output.usage["model"] == "backup"
    assert output.text == "the backup answers"


async def test_content_policy_is_not_retried(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    model.script([Reply.content_policy(), Reply.text("must never be asked for")])
    run = await one_run(platform, model, tmp_path, "something forbidden")
    assert run.exit_code == exits.MODEL_REFUSED  # the orchestrator does not retry it
    assert len(model.completion_requests) == 1
    events = await activation_events(platform, run)
    output = next(e for e in events if isinstance(e, ActivationOutputRecorded))
    assert output.reason == "failed"
    assert "content_policy" in output.text
    assert isinstance(events[-1], ActivationFailed)


async def test_budget_exhausted_ends_with_a_grace_call(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    read = Reply.tool_calls([ToolCall("file_read", {"path": "."})])
    model.script([read, read, Reply.text("Where I stand: listed twice; next: read files.")])
    config = RunnerConfig(max_model_calls=2)
    run = await one_run(platform, model, tmp_path, "explore", config=config)
    assert run.exit_code == exits.BUDGET_EXHAUSTED, run.stderr
    grace = model.completion_requests[2]
    assert not grace.json.get("tools")
    assert "used all the model calls" in grace.messages[-1]["content"]
    output = next(
        e for e in await activation_events(platform, run) if isinstance(e, ActivationOutputRecorded)
    )
    assert output.reason == "budget_exhausted"
    assert output.text.startswith("Where I stand")


async def test_truncated_output_is_retried_with_a_larger_cap(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    model.script([Reply.text("cut off mid", finish_reason="length"), Reply.text("whole answer")])
    config = RunnerConfig(max_output_tokens=1_000)
    run = await one_run(platform, model, tmp_path, "long answer please", config=config)
    assert run.exit_code == exits.COMPLETED, run.stderr
    caps = [r.json["max_tokens"] for r in model.completion_requests]
    assert caps == [1_000, 2_000]
    output = next(
        e for e in await activation_events(platform, run) if isinstance(e, ActivationOutputRecorded)
    )
    assert output.text == "whole answer"
    assert output.usage["model_calls"] == 1


async def test_secrets_never_reach_the_model_through_tool_results(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    model.script(
        [
            Reply.tool_calls([ToolCall("shell_exec", {"command": "cat ../input.json"})]),
            Reply.text("nothing to see"),
        ]
    )
    run = await one_run(platform, model, tmp_path, "show me your input")
    assert run.exit_code == exits.COMPLETED, run.stderr
    token = json.loads(run.input_path.read_text())["token"]
    result = model.requests[1].messages[-1]["content"]
    assert '"token":"[redacted]"' in result.replace(" ", "")
    assert token not in result
    entries = await history(platform, run.world)  # type: ignore[attr-defined]
    assert any("[redacted]" in e.text for e in entries)  # the tool's result, as recorded
    assert all(token not in e.text for e in entries)
