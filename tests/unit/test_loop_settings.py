"""The agent loop's figures are settings (DESIGN.md Appendix A): a model's own context window
and output cap (a fallback compacts against its own window, and writes within its own cap),
a runtime profile's loop limits, and a tool round that never cuts a call short of the time
the call itself is allowed (a 600 s command is not killed at the round's 300 s; shown here
with small figures). The model is the scripted model server (the one allowed fake); the
broker an `httpx.MockTransport` recording what the runner sends."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from suzumio.contracts.runner import RunnerActivationInput, RunnerConfig
from suzumio.contracts.values import LoopSettings, ModelSpec, RuntimeProfileSpec, ToolPolicy
from suzumio.runner.agent import AgentLoop, Ending
from suzumio.runner.broker import BrokerClient
from suzumio.runner.live import LiveStream
from suzumio.runner.loop import figures
from suzumio.runner.loop.segments import CallFailure, run_segments
from suzumio.runner.model import Endpoint, ModelClient
from suzumio.runner.toolbox import Toolbox
from suzumio.runner.tools.base import ToolContext
from suzumio.testing.model_server import (
    RecordedRequest,
    Reply,
    ScriptedModelServer,
    ToolCall,
    Usage,
)
from tests.unit.loop_support import TOKEN, Broker, spec
from tests.unit.test_compaction_anchor_review import cjk_history, is_summariser, read_a

SUMMARY = "## Goal\nrefactor\n## Remaining work\nnone"


class SlowAnswer(Broker):
    """A person who answers a question (or an approval: yes) after `delay` seconds."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    async def answer_slowly(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != "/runner/ask":
            return self.answer(request)
        self.answer(request)  # recorded
        await asyncio.sleep(self.delay)
        body = json.loads(request.content)
        outcome = {"status": "answered", "answer": "blue", "approved": True}
        return httpx.Response(200, json={"pending_action_id": body["pending_action_id"], **outcome})


async def run_loop(
    tmp_path: Path,
    replies: dict[str | None, list[Reply]],
    models: list[ModelSpec],
    activation: RunnerActivationInput | None = None,
    broker: Broker | None = None,
    **runner: Any,
) -> tuple[Ending, Broker, list[RecordedRequest]]:
    """The loop of `activation` (or a plain one) over `models`, the scripted server playing
    `replies` by model name (None: shared)."""
    broker = broker or Broker()
    handler = broker.answer_slowly if isinstance(broker, SlowAnswer) else broker.answer
    http = httpx.AsyncClient(base_url="http://broker", transport=httpx.MockTransport(handler))
    client = BrokerClient("http://broker", TOKEN, http=http)
    activation = activation or spec(tmp_path)
    activation = activation.model_copy(
        update={"runner": activation.runner.model_copy(update=runner)}
    )
    (tmp_path / "a.txt").write_text("a\n")
    toolbox = Toolbox(activation, client, ToolContext(workspace=tmp_path))
    async with ScriptedModelServer() as server:
        for name, steps in replies.items():
            server.script(steps, model=name)
        clients = [ModelClient(m, Endpoint(f"{server.url}/v1", "k")) for m in models]
        loop = AgentLoop(activation, client, clients, toolbox, LiveStream(client), [])
        try:
            ending = await loop.run()
        finally:
            for model in clients:
                await model.close()
            await http.aclose()
        requests = server.completion_requests
    return ending, broker, requests


# -- the contracts ----------------------------------------------------------------------------


def test_a_models_window_and_output_cap_are_bounded() -> None:
    spec = ModelSpec(name="m", context_window=32_000, max_output_tokens=8_000)
    assert (spec.context_window, spec.max_output_tokens) == (32_000, 8_000)
    assert ModelSpec(name="m").context_window is None  # the platform's default
    for bad in (
        {"context_window": 100},  # below 1,024
        {"context_window": 10**12},
        {"max_output_tokens": 0},
        {"context_window": 8_000, "max_output_tokens": 8_000},  # leaves no room for a prompt
        {"context_windw": 8_000},  # a typo is an error
    ):
        with pytest.raises(ValidationError):
            ModelSpec.model_validate({"name": "m", **bad})


def test_unset_figures_are_left_out_of_the_runners_input(tmp_path: Path) -> None:
    """A runner from before these fields refuses unknown keys in a model spec: an input whose
    models set no figures must read exactly as before."""
    wire = json.loads(spec(tmp_path).model_dump_json())
    assert wire["agent"]["model"] == {"name": "primary", "provider": None}
    sized = ModelSpec(name="m", context_window=8_192)
    assert json.loads(sized.model_dump_json()) == {
        "name": "m",
        "provider": None,
        "context_window": 8_192,
    }
    assert ModelSpec.model_validate_json(sized.model_dump_json()) == sized


def test_a_profiles_loop_settings_are_bounded_and_typos_refused() -> None:
    profile = RuntimeProfileSpec.model_validate(
        {"loop": {"max_model_calls": 12, "tool_timeout_seconds": 900}}
    )
    assert profile.loop.overrides() == {"max_model_calls": 12, "tool_timeout_seconds": 900.0}
    assert RuntimeProfileSpec().loop.overrides() == {}  # nothing set: the platform's defaults
    for bad in (
        {"max_model_calls": 0},
        {"max_parallel_tools": 65},
        {"tool_timeout_seconds": 0},
        {"tool_timeout_seconds": float("inf")},
        {"max_retries": -1},
        {"ask_wait_seconds": 301},
        {"approval_wait_seconds": -1},
        {"max_model_call": 5},
    ):
        with pytest.raises(ValidationError):
            LoopSettings.model_validate(bad)


def test_the_threshold_and_output_cap_are_the_models() -> None:
    config = RunnerConfig()
    assert figures.threshold(ModelSpec(name="m"), config) == int(0.5 * (128_000 - 4_096))
    small = ModelSpec(name="m", context_window=20_000)
    assert figures.threshold(small, config) == int(0.5 * (20_000 - 4_096))
    capped = ModelSpec(name="m", context_window=20_000, max_output_tokens=2_000)
    assert figures.threshold(capped, config) == int(0.5 * (20_000 - 2_000))
    assert figures.output_tokens(capped, config) == (2_000, 2_000)
    assert figures.output_tokens(ModelSpec(name="m"), config) == (4_096, 32_768)
    # A small window without a cap of its own: at most half of it, doubled no further.
    assert figures.output_tokens(ModelSpec(name="m", context_window=4_000), config) == (
        2_000,
        2_000,
    )
    # A cap near the window reserves at most half of it: not a threshold of nothing.
    huge = ModelSpec(name="m", max_output_tokens=200_000)
    assert figures.threshold(huge, config) == int(0.5 * 64_000)


# -- the loop ---------------------------------------------------------------------------------


async def test_a_model_with_a_small_window_compacts_at_its_own_threshold(tmp_path: Path) -> None:
    """9,000 tokens are far below the platform's 128,000 window, but over this model's
    threshold (0.5 x (20,000 - 4,096) = 7,952)."""
    replies = [
        Reply.tool_calls([read_a("r1")], usage=Usage(prompt_tokens=9_000, completion_tokens=20)),
        Reply.text(SUMMARY),
        Reply.text("done", usage=Usage(prompt_tokens=3_000, completion_tokens=5)),
    ]
    primary = ModelSpec(name="primary", context_window=20_000)
    activation = spec(tmp_path, history=cjk_history())
    ending, _, requests = await run_loop(tmp_path, {None: replies}, [primary], activation)
    assert ending.reason == "completed", ending
    assert ending.usage["compactions"] == 1
    assert [is_summariser(r.messages) for r in requests] == [False, True, False]


async def test_a_fallback_with_a_smaller_window_compacts_against_its_own(tmp_path: Path) -> None:
    """The primary (the platform's 128,000 window) took 12,000 tokens without a compaction;
    when it disappears, the fallback's 20,000 window makes that too much (its threshold:
    0.5 x (20,000 - 1,500) = 9,250): the prompt is compacted — by the fallback, within its
    own output cap — before the fallback is asked."""
    replies: dict[str | None, list[Reply]] = {
        "big": [
            Reply.tool_calls(
                [read_a("r1")], usage=Usage(prompt_tokens=12_000, completion_tokens=20)
            ),
            Reply.model_not_found("big"),
        ],
        "small": [Reply.text(SUMMARY), Reply.text("done")],
    }
    models = [
        ModelSpec(name="big"),
        ModelSpec(name="small", context_window=20_000, max_output_tokens=1_500),
    ]
    activation = spec(tmp_path, history=cjk_history())
    ending, _, requests = await run_loop(tmp_path, replies, models, activation)
    assert ending.reason == "completed", ending
    assert ending.usage["compactions"] == 1
    small = [r for r in requests if r.model == "small"]
    assert [is_summariser(r.messages) for r in small] == [True, False]
    assert [r.json["max_tokens"] for r in small] == [1_500, 1_500]
    big = [r for r in requests if r.model == "big"]
    assert [r.json["max_tokens"] for r in big] == [4_096, 4_096]  # the platform's


async def test_a_reply_cut_off_at_the_models_own_cap_is_not_asked_again(tmp_path: Path) -> None:
    """The model says what it can write: asking for more would only be refused."""
    replies = [Reply.text("as far as it goes", finish_reason="length")]
    primary = ModelSpec(name="primary", max_output_tokens=1_000)
    ending, _, requests = await run_loop(tmp_path, {None: replies}, [primary])
    assert ending.reason == "completed", ending
    assert ending.text == "as far as it goes"
    assert [r.json["max_tokens"] for r in requests] == [1_000]


# -- the tool round's time limit ----------------------------------------------------------------


def shell(command: str, timeout: float) -> ToolCall:
    return ToolCall("shell_exec", {"command": command, "timeout_seconds": timeout})


async def test_the_round_limit_never_cuts_a_command_short_of_its_own_timeout(
    tmp_path: Path,
) -> None:
    """A round of 0.3 s and a command allowed 10 s that takes 1.5 s (as a 600 s command in
    a 300 s round): it runs to its end."""
    replies = [Reply.tool_calls([shell("sleep 1.5; echo finished-late", 10)]), Reply.text("ok")]
    ending, broker, _ = await run_loop(
        tmp_path, {None: replies}, [ModelSpec(name="primary")], tool_timeout_seconds=0.3
    )
    assert ending.reason == "completed", ending
    [result] = broker.tool_results()
    assert "finished-late" in result["text"], result
    assert "[exit 0 in " in result["text"], result
    [finished] = broker.bodies["/runner/tool-calls/finish"]
    assert finished["status"] == "ok"


async def test_a_command_past_its_own_timeout_is_ended_by_it_not_by_the_round(
    tmp_path: Path,
) -> None:
    replies = [Reply.tool_calls([shell("sleep 30", 0.5)]), Reply.text("ok")]
    ending, broker, _ = await run_loop(
        tmp_path, {None: replies}, [ModelSpec(name="primary")], tool_timeout_seconds=0.2
    )
    assert ending.reason == "completed", ending
    [result] = broker.tool_results()
    assert "timed out after 0.5s; process group killed" in result["text"], result
    [finished] = broker.bodies["/runner/tool-calls/finish"]
    assert finished["status"] == "timeout"


async def test_a_question_waits_its_own_time_not_the_rounds(tmp_path: Path) -> None:
    """ask_user may wait `ask_wait_seconds` (here 5 s) for its answer, though the round's
    limit is 0.2 s: the answer that comes after 0.6 s is the tool's result."""
    replies = [Reply.tool_calls([ToolCall("ask_user", {"question": "colour?"})]), Reply.text("ok")]
    ending, broker, _ = await run_loop(
        tmp_path,
        {None: replies},
        [ModelSpec(name="primary")],
        broker=SlowAnswer(0.6),
        tool_timeout_seconds=0.2,
        ask_wait_seconds=5,
    )
    assert ending.reason == "completed", ending
    [result] = broker.tool_results()
    assert "blue" in result["text"], result


async def test_an_approval_waits_its_own_time_before_the_tool_runs(tmp_path: Path) -> None:
    replies = [Reply.tool_calls([read_a("r1")]), Reply.text("ok")]
    activation = spec(tmp_path).model_copy(update={"permissions": {"file.read": ToolPolicy.ASK}})
    ending, broker, _ = await run_loop(
        tmp_path,
        {None: replies},
        [ModelSpec(name="primary")],
        activation,
        broker=SlowAnswer(0.6),
        tool_timeout_seconds=0.2,
        approval_wait_seconds=5,
    )
    assert ending.reason == "completed", ending
    [result] = broker.tool_results()
    assert "time limit" not in result["text"], result
    [finished] = broker.bodies["/runner/tool-calls/finish"]
    assert finished["status"] == "ok"  # approved, then read


async def test_a_call_runs_its_allowance_but_later_segments_keep_the_rounds_limit() -> None:
    """Call 0 is allowed 5 s in a round of 0.2 s and takes 0.5 s: it finishes; call 1, in
    the next segment, is not started (the round's time is spent); the results keep order."""

    async def run_one(index: int) -> str:
        await asyncio.sleep(0.5 if index == 0 else 0)
        return f"done {index}"

    results = await run_segments([[0], [1]], run_one, 0.2, {0: 5.0})
    assert results[0] == "done 0"
    assert isinstance(results[1], CallFailure)
    assert results[1].reason == "not_started"
