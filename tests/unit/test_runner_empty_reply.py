"""A reply with neither text nor calls is not the model's answer (DESIGN, Appendix A: turns
that stop after a tool with no explanation): asked again once, and said nothing twice in a
row, the activation ends with a text that says so — never with an empty answer, nor an empty
assistant entry in the history, which some providers refuse.

The model is the scripted model server (the one allowed fake) through the real openai SDK; the
broker is an `httpx.MockTransport` (tests.unit.loop_support)."""

from __future__ import annotations

from pathlib import Path

from suzumio.runner.agent import NO_REPLY
from suzumio.testing.model_server import Reply, ToolCall
from tests.unit.loop_support import run_loop, spec


async def test_a_reply_of_nothing_after_a_tool_is_asked_for_again(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a")
    replies = [
        Reply.tool_calls([ToolCall("file_read", {"path": "a.txt"})]),
        Reply.text(""),
        Reply.text("It says a."),
    ]
    run = await run_loop(tmp_path, spec(tmp_path), replies)
    assert (run.ending.reason, run.ending.text) == ("completed", "It says a.")
    assert len(run.model_requests) == 3
    # Asked the same again: nothing of the empty reply went into the conversation.
    assert run.model_requests[2].messages == run.model_requests[1].messages
    [entry] = [e for e in run.ending.history if e.role == "assistant"]
    assert entry.text == "It says a."


async def test_nothing_twice_in_a_row_ends_with_a_text_that_says_so(tmp_path: Path) -> None:
    run = await run_loop(tmp_path, spec(tmp_path), [Reply.text(""), Reply.text(" \n")])
    assert (run.ending.reason, run.ending.text) == ("completed", NO_REPLY)
    assert len(run.model_requests) == 2
    [entry] = [e for e in run.ending.history if e.role == "assistant"]
    assert entry.text == NO_REPLY
