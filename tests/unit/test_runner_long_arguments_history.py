"""A tool call whose arguments pass what a history entry holds (1 M characters: a large
`file.write`) was kept in the history cut — no JSON at all — and the session's next
activations sent it back to providers that refuse a conversation with invalid arguments. It is
kept as a JSON object holding the arguments' start and size.

The model is the scripted model server (the one allowed fake) through the real openai SDK; the
broker is an `httpx.MockTransport` (tests.unit.loop_support)."""

from __future__ import annotations

import json
from pathlib import Path

from suzumio.testing.model_server import Reply, ToolCall
from tests.unit.loop_support import Broker, run_loop, spec


async def test_arguments_past_an_entrys_bound_are_kept_as_json(tmp_path: Path) -> None:
    content = "x" * 1_200_000
    write = ToolCall("file_write", {"path": "big.txt", "content": content})
    broker = Broker()
    run = await run_loop(
        tmp_path, spec(tmp_path), [Reply.tool_calls([write]), Reply.text("ok")], broker
    )
    assert run.ending.reason == "completed", run.ending
    assert (tmp_path / "big.txt").read_text() == content  # the call itself ran whole
    entries = [e for b in broker.bodies["/runner/history"] for e in b["entries"]]
    [asked] = [e for e in entries if e["role"] == "assistant" and e.get("tool_calls")]
    kept = json.loads(asked["tool_calls"][0]["arguments"])
    assert kept["characters"] > 1_000_000
    assert kept["truncated_arguments"].startswith('{"path": "big.txt"')
