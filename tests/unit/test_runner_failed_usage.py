"""What an activation's usage says it spent and what failed on the way.

An activation that fails after it spent model calls says what it spent: before, the endings
the loop did not reach itself (the model failed, the time ran out, the broker refused)
reported an empty usage. Every failed model call is in it by failure class, the ones the loop
got past included (operators count them). The model is the scripted model server (the one
allowed fake)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from suzumio.contracts.values import ModelSpec
from suzumio.runner import exits
from suzumio.runner.agent import GRACE_FAILED, AgentLoop, Ending
from suzumio.runner.broker import BrokerClient
from suzumio.runner.live import LiveStream
from suzumio.runner.main import _run_loop
from suzumio.runner.model import Endpoint, ModelClient
from suzumio.runner.toolbox import Toolbox
from suzumio.runner.tools.base import ToolContext
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall, Usage
from tests.unit.loop_support import TOKEN, Broker, spec


async def run_chain(
    tmp_path: Path, replies: list[Reply], chain: tuple[str, ...] = ("primary",), **runner: Any
) -> tuple[Ending, int]:
    """One activation's loop against `replies`, with `chain`'s models in turn (a fallback
    chain), all on the scripted server."""
    http = httpx.AsyncClient(
        base_url="http://broker", transport=httpx.MockTransport(Broker().answer)
    )
    client = BrokerClient("http://broker", TOKEN, http=http)
    activation = spec(tmp_path)
    activation = activation.model_copy(
        update={"runner": activation.runner.model_copy(update=runner)}
    )
    toolbox = Toolbox(activation, client, ToolContext(workspace=tmp_path))
    async with ScriptedModelServer() as server:
        server.script(replies)
        models = [ModelClient(ModelSpec(name=n), Endpoint(f"{server.url}/v1", "k")) for n in chain]
        loop = AgentLoop(activation, client, models, toolbox, LiveStream(client), [])
        try:
            return await _run_loop(activation, client, loop, tmp_path)
        finally:
            for model in models:
                await model.close()
            await http.aclose()


async def test_a_model_that_fails_after_a_round_leaves_its_calls_counted(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x")
    ending, code = await run_chain(
        tmp_path,
        [
            Reply.tool_calls([ToolCall("file_read", {"path": "a.txt"})]),
            Reply.error(401, '{"error": {"message": "key revoked"}}'),
        ],
    )
    assert (ending.reason, code) == ("failed", exits.MODEL_REFUSED)  # a refused key
    assert ending.usage["model_calls"] == 1
    assert ending.usage["model"] == "primary"
    # The failure that ended it is a failed call too.
    assert ending.usage["model_failures"] == {"auth": 1}


async def test_the_usage_counts_the_failed_calls_the_loop_got_past(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rate limit a retry got past and a missing model the fallback got past leave the
    activation completed: its usage still says they happened."""
    monkeypatch.setattr("suzumio.runner.agent.backoff_seconds", lambda *_: 0.0)
    replies = [
        Reply.error(429, '{"error": {"message": "slow down"}}'),
        Reply.error(404, '{"error": {"message": "model not found"}}'),
        Reply.text("the backup answered"),
    ]
    ending, code = await run_chain(tmp_path, replies, ("primary", "backup"))
    assert (ending.reason, code) == ("completed", exits.COMPLETED), ending.text
    assert ending.text == "the backup answered"
    assert ending.usage["model"] == "backup"
    assert ending.usage["model_calls"] == 1  # the failed calls are not counted calls
    assert ending.usage["model_failures"] == {"rate_limit": 1, "model_not_found": 1}


async def test_an_activation_without_a_failed_call_reports_no_failures(tmp_path: Path) -> None:
    ending, _ = await run_chain(tmp_path, [Reply.text("all well")])
    assert ending.text == "all well"
    assert "model_failures" not in ending.usage


async def test_a_reply_cut_by_the_content_filter_is_no_answer(tmp_path: Path) -> None:
    """A reply the provider's filter cut short (`finish_reason: content_filter`) came as an
    answer: what was left of it ended the activation `completed`. It is the content policy's
    refusal: the next model of the chain answers; without one, the activation fails."""
    filtered = Reply.text("Here is how to", finish_reason="content_filter")
    ending, code = await run_chain(
        tmp_path, [filtered, Reply.text("the backup answered")], ("primary", "backup")
    )
    assert (ending.reason, code, ending.text) == (
        "completed",
        exits.COMPLETED,
        "the backup answered",
    )
    assert ending.usage["model_failures"] == {"content_policy": 1}

    ending, code = await run_chain(tmp_path, [filtered])
    assert (ending.reason, code) == ("failed", exits.MODEL_REFUSED)
    assert ending.text != "Here is how to"


async def test_a_reply_cut_off_by_the_output_cap_is_billed_though_asked_again(
    tmp_path: Path,
) -> None:
    cut = Reply.text(
        "half", finish_reason="length", usage=Usage(prompt_tokens=10, completion_tokens=5)
    )
    whole = Reply.text("whole", usage=Usage(prompt_tokens=10, completion_tokens=7))
    ending, code = await run_chain(tmp_path, [cut, whole])
    assert (ending.reason, code, ending.text) == ("completed", exits.COMPLETED, "whole")
    assert ending.usage["model_calls"] == 1  # asked again with room: not a new call
    assert (ending.usage["prompt_tokens"], ending.usage["completion_tokens"]) == (20, 12)


async def test_a_summary_the_model_cannot_write_still_ends_the_budget_exhausted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The budget's last, tool-free call refused (Bedrock and Claude gateways refuse a
    conversation with tool calls and no tools): the work still ended for the budget, exit 4
    — as a model failure (exit 5) the orchestrator retried it with a fresh budget."""
    monkeypatch.setattr("suzumio.runner.agent.backoff_seconds", lambda *_: 0.0)
    (tmp_path / "a.txt").write_text("x")
    refused = Reply.error(400, '{"error": {"message": "The toolConfig field must be defined"}}')
    replies = [Reply.tool_calls([ToolCall("file_read", {"path": "a.txt"})]), *[refused] * 4]
    ending, code = await run_chain(tmp_path, replies, max_model_calls=1)
    assert (ending.reason, code) == ("budget_exhausted", exits.BUDGET_EXHAUSTED)
    assert ending.text.startswith(GRACE_FAILED)
    assert ending.usage["model_calls"] == 1


async def test_a_fault_of_the_runners_own_still_ends_with_an_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception nobody expected (a broker body the runner cannot read, a bound it did not
    foresee) left only "runner exit 1": no output, no usage."""

    async def broken(_: AgentLoop) -> Ending:
        raise ValueError("a bound nobody foresaw")

    monkeypatch.setattr(AgentLoop, "run", broken)
    ending, code = await run_chain(tmp_path, [])
    assert (ending.reason, code) == ("failed", exits.CRASHED)
    assert ending.text == "the runner failed: ValueError: a bound nobody foresaw"
    assert ending.usage["model_calls"] == 0


async def test_a_chain_refused_only_after_a_model_that_was_down_may_be_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The primary answered 503 past its retries, the backup's key was refused: exited as
    refused for good, the attempt was not retried, though the primary would answer minutes
    later. Refused for good only when every model of the chain was."""
    monkeypatch.setattr("suzumio.runner.agent.backoff_seconds", lambda *_: 0.0)
    down = Reply.error(503, '{"error": {"message": "overloaded"}}')
    refused = Reply.error(401, '{"error": {"message": "key revoked"}}')
    ending, code = await run_chain(
        tmp_path, [down, down, refused], ("primary", "backup"), max_retries=1
    )
    assert (ending.reason, code) == ("failed", exits.MODEL_FAILED), ending.text

    not_found = Reply.error(404, '{"error": {"message": "model not found"}}')
    ending, code = await run_chain(tmp_path, [not_found, refused], ("primary", "backup"))
    assert (ending.reason, code) == ("failed", exits.MODEL_REFUSED)  # both refused for good
