"""A runner stopped (SIGTERM: a cancel, a drain) while a tool call runs ends that call in the
audit before the stop takes effect, as the wall clock's stop does: it was left with a start and
no end, running for ever to whoever reads the audit. And a call whose start was asked for is
open though its answer has not come: the start may be recorded all the same.

The model is the scripted model server (the one allowed fake) through the real openai SDK; the
broker is an `httpx.MockTransport` (tests.unit.loop_support)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from suzumio.testing.model_server import Reply, ToolCall
from tests.unit.loop_support import Broker, run_loop, spec

START, FINISH = "/runner/tool-calls/start", "/runner/tool-calls/finish"


async def started(broker: Broker) -> None:
    while not broker.bodies.get(START):
        await asyncio.sleep(0.01)


async def test_a_stopped_runner_ends_the_call_it_was_running(tmp_path: Path) -> None:
    broker = Broker()
    sleep = ToolCall("shell_exec", {"command": "sleep 30"})
    replies = [Reply.tool_calls([sleep]), Reply.text("done")]
    running = asyncio.create_task(run_loop(tmp_path, spec(tmp_path), replies, broker))
    await asyncio.wait_for(started(broker), 30)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    [start] = broker.bodies[START]
    [finish] = broker.bodies.get(FINISH, [])
    assert finish["call_id"] == start["call_id"]
    assert finish["status"] == "cancelled"


class SlowStart(Broker):
    """Records the start, and answers it only after a long while (a broker under load)."""

    async def answer(self, request: httpx.Request) -> httpx.Response:  # type: ignore[override]
        response = super().answer(request)
        if request.url.path == START:
            await asyncio.sleep(30)
        return response


async def test_a_start_the_wall_clock_cut_is_ended_as_timed_out(tmp_path: Path) -> None:
    """The start was recorded, its answer had not come when the wall clock ran out: the call
    was not open yet to the runner, and nothing ended it."""
    broker = SlowStart()
    (tmp_path / "a.txt").write_text("a")
    activation = spec(tmp_path)
    activation = activation.model_copy(
        update={"runner": activation.runner.model_copy(update={"wall_clock_seconds": 1})}
    )
    read = ToolCall("file_read", {"path": "a.txt"})
    run = await run_loop(tmp_path, activation, [Reply.tool_calls([read])], broker)
    assert run.ending.reason == "failed"
    [start] = broker.bodies[START]
    [finish] = broker.bodies.get(FINISH, [])
    assert (finish["call_id"], finish["status"]) == (start["call_id"], "timeout")


HISTORY = "/runner/history"


def results(entries: list[dict[str, object]]) -> list[tuple[object, object]]:
    return [(e["tool_call_id"], e["text"]) for e in entries if e["role"] == "tool"]


async def test_the_wall_clock_keeps_what_the_calls_that_finished_did(tmp_path: Path) -> None:
    """A round cut by the wall clock: the read that finished is recorded with its result and
    the command that was running as stopped — with the output, not left out. Left out, the
    next activation read both as never finished, and the model made them again."""
    (tmp_path / "a.txt").write_text("contents of a")
    activation = spec(tmp_path)
    activation = activation.model_copy(
        update={"runner": activation.runner.model_copy(update={"wall_clock_seconds": 2})}
    )
    read = ToolCall("file_read", {"path": "a.txt"}, id="read-1")
    sleep = ToolCall("shell_exec", {"command": "sleep 30"}, id="sleep-1")
    run = await run_loop(tmp_path, activation, [Reply.tool_calls([read, sleep])])
    assert run.ending.reason == "failed"
    recorded = [e.model_dump() for e in run.ending.history]
    [(first, text), (second, stopped)] = results(recorded)
    assert (first, second) == ("read-1", "sleep-1")
    assert "contents of a" in str(text)
    assert "ran out of time" in str(stopped)
    assert "may have taken effect" in str(stopped)


async def test_a_stopped_runner_records_what_its_round_did(tmp_path: Path) -> None:
    broker = Broker()
    (tmp_path / "a.txt").write_text("contents of a")
    read = ToolCall("file_read", {"path": "a.txt"}, id="read-1")
    sleep = ToolCall("shell_exec", {"command": "sleep 30"}, id="sleep-1")
    replies = [Reply.tool_calls([read, sleep]), Reply.text("done")]
    running = asyncio.create_task(run_loop(tmp_path, spec(tmp_path), replies, broker))

    async def sleeping() -> None:
        while len(broker.bodies.get(START, [])) < 2:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(sleeping(), 30)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    appended = [e for body in broker.bodies.get(HISTORY, []) for e in body["entries"]]
    [(first, text), (second, stopped)] = results(appended)
    assert (first, second) == ("read-1", "sleep-1")
    assert "contents of a" in str(text)
    assert "the runner was stopped" in str(stopped)
    assert "may have taken effect" in str(stopped)
