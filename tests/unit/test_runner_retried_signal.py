"""A retried activation (its attempt 1 failed after it recorded its signals' entries) gets the
same signals again, and the history its entries: a non-message signal's entry was pushed a
second time at the end, and the model read the reminder twice — and might do its work twice.

The model is the scripted model server (the one allowed fake) through the real openai SDK; the
broker is an `httpx.MockTransport` (tests.unit.loop_support)."""

from __future__ import annotations

from pathlib import Path

from suzumio.contracts.ids import derived_id, new_id
from suzumio.contracts.runner import AgentHistoryMessage, SignalSpec
from suzumio.contracts.values import Priority, SignalKind
from suzumio.runner.context import render_signal
from suzumio.testing.model_server import Reply
from tests.unit.loop_support import Broker, run_loop, spec


async def test_a_signal_an_earlier_attempt_recorded_is_not_told_twice(tmp_path: Path) -> None:
    reminder = SignalSpec(
        id=new_id(), kind=SignalKind.TIMER, priority=Priority.P3, payload={"todo": "release"}
    )
    text = render_signal(reminder)
    recorded = AgentHistoryMessage(
        id=derived_id("signal.entry", reminder.id), role="user", content=text
    )
    activation = spec(tmp_path, history=(recorded,))
    activation = activation.model_copy(
        update={"activation": activation.activation.model_copy(update={"signals": (reminder,)})}
    )
    broker = Broker()
    run = await run_loop(tmp_path, activation, [Reply.text("released")], broker)
    assert run.ending.reason == "completed", run.ending
    [request] = run.model_requests
    told = [m for m in request.messages if m.get("role") == "user" and m.get("content") == text]
    assert len(told) == 1
    appended = [e for b in broker.bodies.get("/runner/history", []) for e in b["entries"]]
    assert all(e["text"] != text for e in appended)


async def test_a_new_signal_is_told_and_recorded(tmp_path: Path) -> None:
    reminder = SignalSpec(id=new_id(), kind=SignalKind.TIMER, priority=Priority.P3)
    activation = spec(tmp_path)
    activation = activation.model_copy(
        update={"activation": activation.activation.model_copy(update={"signals": (reminder,)})}
    )
    broker = Broker()
    run = await run_loop(tmp_path, activation, [Reply.text("ok")], broker)
    text = render_signal(reminder)
    [request] = run.model_requests
    assert [m["content"] for m in request.messages if m.get("role") == "user"][-1] == text
    appended = [e for b in broker.bodies.get("/runner/history", []) for e in b["entries"]]
    assert any(e["text"] == text for e in appended)
