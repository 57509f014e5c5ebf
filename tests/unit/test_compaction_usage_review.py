"""The summary a compaction asks the model for is billed like any other call: the activation's
usage must count its tokens (before, `_compact` called the model directly and its usage was
dropped, so an activation's reported spend was short by every summary). The model is the
scripted model server (the one allowed fake); the broker an `httpx.MockTransport`."""

from __future__ import annotations

from pathlib import Path

from suzumio.testing.model_server import Reply, Usage
from tests.unit.test_compaction_anchor_review import cjk_history, is_summariser, read_a, run_loop


async def test_a_compactions_summary_counts_in_the_activations_usage(tmp_path: Path) -> None:
    replies = [
        Reply.tool_calls([read_a("r1")], usage=Usage(prompt_tokens=9_000, completion_tokens=20)),
        Reply.text(
            "## Goal\nrefactor\n## Remaining work\nnone",
            usage=Usage(prompt_tokens=7_000, completion_tokens=300),
        ),
        Reply.text("done", usage=Usage(prompt_tokens=3_000, completion_tokens=5)),
    ]
    ending, _, requests = await run_loop(tmp_path, replies, cjk_history())
    assert ending.reason == "completed", ending
    assert [is_summariser(m) for m in requests] == [False, True, False]
    assert ending.usage["prompt_tokens"] == 9_000 + 7_000 + 3_000
    assert ending.usage["completion_tokens"] == 20 + 300 + 5
    assert ending.usage["model_calls"] == 2  # the budget counts the agent's own calls
