"""Tools print NUL characters (`find -print0`, a binary's output, decoded with "replace"), and
the tool-broker refuses them (the log's read models cannot hold them): the runner shows them as
`\\0`, so such a result is an ordinary tool result and the activation goes on."""

from __future__ import annotations

from pathlib import Path

from suzumio.contracts.broker import HistoryAppend
from suzumio.runner.tools.base import printable
from suzumio.testing.model_server import Reply, ToolCall
from tests.unit.loop_support import Broker
from tests.unit.test_runner_review_fixes import run_loop, spec


def test_printable_shows_nul_as_an_escape() -> None:
    assert printable("a\x00b\x00") == "a\\0b\\0"
    assert printable("caf\udce9\x00") == "caf\\xe9\\0"  # with a name that is not UTF-8


async def test_a_tool_printing_nul_is_an_ordinary_result(tmp_path: Path) -> None:
    broker = Broker()
    calls = [ToolCall("shell_exec", {"command": "printf 'a\\000b\\000'"})]
    ending, _ = await run_loop(
        spec(tmp_path), [Reply.tool_calls(calls), Reply.text("done")], broker
    )
    assert ending.reason == "completed"
    [result] = broker.tool_results()
    assert "a\\0b\\0" in result["text"]
    # What the runner sent, the broker takes: the tool's result among it, escaped.
    sent = [HistoryAppend.model_validate(body) for body in broker.bodies["/runner/history"]]
    [tool_entry] = [e for h in sent for e in h.entries if e.role == "tool"]
    assert "a\\0b\\0" in tool_entry.text


async def test_a_result_given_by_the_model_with_nul_is_shown_escaped(tmp_path: Path) -> None:
    """The final text is stored with the activation's output, which refuses NUL: before,
    the runner's own check crashed the activation there, with no output at all."""
    broker = Broker()
    calls = [ToolCall("activation_complete", {"result": "done\x00"})]
    ending, _ = await run_loop(spec(tmp_path), [Reply.tool_calls(calls)], broker)
    assert (ending.reason, ending.text) == ("completed", "done\\0")
