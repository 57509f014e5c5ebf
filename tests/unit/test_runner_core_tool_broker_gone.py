"""A core tool (`message.send`) whose broker call went unanswered — the broker applied it, its
answers were lost (5xx, a restart) until the retries ran out — ends the activation as the
broker being out of reach, the round's result recorded. Told to the model as a failed call, a
broker back by then saw the model send the message again under a new call id: the other agent
got it, and was woken, twice.

The model is the scripted model server (the one allowed fake) through the real openai SDK; the
broker is an `httpx.MockTransport` (tests.unit.loop_support)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from suzumio.runner.broker import BrokerUnavailableError
from suzumio.testing.model_server import Reply, ToolCall
from tests.unit.loop_support import Broker, run_loop, spec

SUPPORT = "/toolpacks/core/support"


class AnswersLost(Broker):
    """Applies each support call (notes it), then answers 503: the answer never arrives."""

    def answer(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == SUPPORT:
            super().answer(request)
            return httpx.Response(503, json={"code": "unavailable", "status": 503})
        return super().answer(request)


async def test_a_core_tool_the_broker_never_answered_ends_the_activation(tmp_path: Path) -> None:
    """Out of the loop as the broker out of reach (`run_activation` exits
    `BROKER_UNREACHABLE` on it), not on to the model's next turn."""
    broker = AnswersLost()
    send = ToolCall("message_send", {"session_id": "b" * 26, "text": "hello"})
    replies = [Reply.tool_calls([send])] * 3 + [Reply.text("done")]
    with pytest.raises(BrokerUnavailableError):
        await run_loop(tmp_path, spec(tmp_path), replies, broker, retries=0)
    assert len(broker.bodies[SUPPORT]) == 1  # sent once, not again at the model's word
    entries = [e for b in broker.bodies.get("/runner/history", []) for e in b["entries"]]
    assert [e["role"] for e in entries] == ["assistant", "tool"]  # the round, recorded
