"""The runner's answers to a review: a call its round stopped still ends in the audit; a reply
with more tool calls than a history entry holds runs what fits instead of crashing; an
output directory the agent made unreadable still lets the rest go. The model is the scripted
model server (the one allowed fake); the broker an `httpx.MockTransport` recording what the
runner sends (its own decisions)."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from suzumio.contracts.runner import RunnerToolpackSpec, ToolDefinition
from suzumio.contracts.toolpacks import ToolpackManifest
from suzumio.contracts.values import ModelSpec
from suzumio.runner.agent import AgentLoop, Ending
from suzumio.runner.broker import BrokerClient
from suzumio.runner.live import LiveStream
from suzumio.runner.model import Endpoint, ModelClient
from suzumio.runner.toolbox import Toolbox
from suzumio.runner.tools.base import ToolContext, ToolResult
from suzumio.runner.workfiles import regular_files
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from tests.unit.loop_support import TOKEN, Broker, spec

HISTORY_ENTRY_CALLS = 128  # what `HistoryEntryIn.tool_calls` holds


async def slow(_: dict[str, Any], __: ToolContext) -> ToolResult:
    await asyncio.sleep(30)
    return ToolResult("never")


def quick(_: dict[str, Any], __: ToolContext) -> ToolResult:
    return ToolResult("ok")


RELEASED = threading.Event()
DAEMON: list[bool] = []


def blocking(_: dict[str, Any], __: ToolContext) -> ToolResult:
    """A plain function that blocks (a slow request made without asyncio)."""
    DAEMON.append(threading.current_thread().daemon)
    RELEASED.wait(20)
    return ToolResult("released")


async def run_loop(tmp_path: Path, replies: list[Reply], **runner: Any) -> tuple[Ending, Broker]:
    broker = Broker()
    http = httpx.AsyncClient(base_url="http://broker", transport=httpx.MockTransport(broker.answer))
    client = BrokerClient("http://broker", TOKEN, http=http)
    activation = spec(
        tmp_path,
        toolpacks=(RunnerToolpackSpec(name="t", tools=("t.slow", "t.quick", "t.blocking")),),
    )
    activation = activation.model_copy(
        update={"runner": activation.runner.model_copy(update=runner)}
    )
    manifest = ToolpackManifest(
        name="t",
        tools=(
            ToolDefinition(name="t.slow"),
            ToolDefinition(name="t.quick"),
            ToolDefinition(name="t.blocking"),
        ),
        runner_handlers={
            "t.slow": f"{__name__}:slow",
            "t.quick": f"{__name__}:quick",
            "t.blocking": f"{__name__}:blocking",
        },
    )
    toolbox = Toolbox(activation, client, ToolContext(workspace=tmp_path), {"t": manifest})
    async with ScriptedModelServer() as server:
        server.script(replies)
        model = ModelClient(ModelSpec(name="primary"), Endpoint(f"{server.url}/v1", "k"))
        loop = AgentLoop(activation, client, [model], toolbox, LiveStream(client), [])
        try:
            ending = await loop.run()
        finally:
            await model.close()
            await http.aclose()
    return ending, broker


async def test_a_call_its_round_stopped_ends_in_the_audit_as_timed_out(tmp_path: Path) -> None:
    """Before, only its start was recorded: the call showed as running for ever. (The call
    after it in the round never starts: the round's time is spent.)"""
    calls = [ToolCall("t_slow", {}), ToolCall("t_quick", {})]
    replies = [Reply.tool_calls(calls), Reply.text("ok")]
    ending, broker = await run_loop(tmp_path, replies, tool_timeout_seconds=0.5)
    assert ending.reason == "completed"
    (started,) = broker.bodies["/runner/tool-calls/start"]
    (finished,) = broker.bodies["/runner/tool-calls/finish"]
    assert started["tool"] == "t.slow"
    assert (finished["call_id"], finished["status"]) == (started["call_id"], "timeout")
    assert "time limit" in finished["error"]


async def test_a_plain_handler_that_blocks_is_held_to_the_rounds_limit(tmp_path: Path) -> None:
    """A toolpack's plain (not async) handler ran on the event loop: one that blocked held
    everything — live output, heartbeats, the round's own time limit — until it returned.
    It runs off the loop: the round's limit ends the call while the handler still blocks."""
    RELEASED.clear()
    replies = [Reply.tool_calls([ToolCall("t_blocking", {})]), Reply.text("ok")]
    try:
        ending, broker = await run_loop(tmp_path, replies, tool_timeout_seconds=0.5)
        still_blocked = not RELEASED.is_set()
    finally:
        RELEASED.set()
    assert ending.reason == "completed"
    assert still_blocked
    # In a daemon thread of its own: one that never returns does not hold the runner at its
    # exit (the loop's executor is waited for, its threads joined).
    assert DAEMON == [True]
    (finished,) = broker.bodies["/runner/tool-calls/finish"]
    assert finished["status"] == "timeout"


async def test_a_reply_with_more_calls_than_an_entry_holds_runs_what_fits(tmp_path: Path) -> None:
    """Before, the history entry refused it and the activation crashed with no output."""
    calls = [ToolCall("t_quick", {}) for _ in range(HISTORY_ENTRY_CALLS + 3)]
    ending, broker = await run_loop(tmp_path, [Reply.tool_calls(calls), Reply.text("done")])
    assert (ending.reason, ending.text) == ("completed", "done")
    results = broker.tool_results()
    assert len(results) == HISTORY_ENTRY_CALLS
    assert "3 more tool calls of this reply were not run" in results[-1]["text"]
    assistant = [
        e
        for b in broker.bodies["/runner/history"]
        for e in b["entries"]
        if e["role"] == "assistant"
    ]
    assert len(assistant[0]["tool_calls"]) == HISTORY_ENTRY_CALLS


def test_an_output_directory_that_cannot_be_looked_into_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`chmod -R 644 out` by the agent: its files cannot be stat'ed (as a user other than
    root). Before, that raised and the activation's whole output was lost."""
    out = tmp_path / "out"
    (out / "d").mkdir(parents=True)
    (out / "d" / "f").write_text("x")
    (out / "kept.txt").write_text("y")
    real_stat = os.stat

    def stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if "/out/d/" in os.fspath(path):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    assert regular_files(out) == [out / "kept.txt"]


async def test_a_call_cut_off_by_the_output_cap_is_asked_for_again_with_room(
    tmp_path: Path,
) -> None:
    """Before, only a text cut off got a larger cap: a call cut off mid-arguments (a large
    file.write) was answered "not valid JSON" under the same cap, every time."""
    cut = ToolCall("file_write", '{"path": "a.txt", "content": "the first ha', id="c1")
    whole = ToolCall("file_write", {"path": "a.txt", "content": "the whole text"}, id="c1")
    broker = Broker()
    http = httpx.AsyncClient(base_url="http://broker", transport=httpx.MockTransport(broker.answer))
    client = BrokerClient("http://broker", TOKEN, http=http)
    activation = spec(tmp_path)
    toolbox = Toolbox(activation, client, ToolContext(workspace=tmp_path))
    async with ScriptedModelServer() as server:
        server.script(
            [
                Reply(calls=(cut,), finish_reason="length"),
                Reply.tool_calls([whole]),
                Reply.text("done"),
            ]
        )
        model = ModelClient(ModelSpec(name="primary"), Endpoint(f"{server.url}/v1", "k"))
        loop = AgentLoop(activation, client, [model], toolbox, LiveStream(client), [])
        try:
            ending = await loop.run()
        finally:
            await model.close()
            await http.aclose()
        caps = [r.body["max_tokens"] for r in server.completion_requests]
    assert ending.text == "done"
    assert (tmp_path / "a.txt").read_text() == "the whole text"
    assert caps[1] == 2 * caps[0]
    assert ending.usage["model_calls"] == 2  # the retry with room is not a counted call
