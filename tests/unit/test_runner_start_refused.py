"""A tool call's audit start the broker refuses for good (409 `limit_reached`: the activation
started as many calls as it may) ends the activation failed with the broker's reason, the
round's results recorded — it was an ordinary tool error, and the model went on calling until
its budget ran out (ending `budget_exhausted`, the reason nowhere).

The model is the scripted model server (the one allowed fake) through the real openai SDK; the
broker is an `httpx.MockTransport` (tests.unit.loop_support)."""

from __future__ import annotations

from pathlib import Path

import httpx

from suzumio.runner import exits
from suzumio.testing.model_server import Reply, ToolCall
from tests.unit.loop_support import Broker, run_loop, spec

LIMIT = "an activation may start at most 3 tool calls"


class Spent(Broker):
    def answer(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/runner/tool-calls/start":
            problem = {"code": "limit_reached", "detail": LIMIT, "status": 409}
            return httpx.Response(409, json=problem)
        return super().answer(request)


async def test_a_start_refused_for_good_ends_the_activation_saying_why(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x")
    broker = Spent()
    read = ToolCall("file_read", {"path": "a.txt"})
    replies = [Reply.tool_calls([read])] * 5 + [Reply.text("done")]
    run = await run_loop(tmp_path, spec(tmp_path), replies, broker)
    ending, code, calls = run.ending, run.code, len(run.model_requests)
    assert (ending.reason, code) == ("failed", exits.CRASHED)
    assert LIMIT in ending.text
    assert calls == 1  # no second model call after the refusal
    assert len(broker.tool_results()) == 1  # the round's result is recorded all the same
