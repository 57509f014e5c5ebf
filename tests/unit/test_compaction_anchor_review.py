"""The compaction threshold is measured from the provider's real usage (seed 003, S5: trust the
provider's usage first, estimate only what was added since; without an anchor, estimate).
Before, the loop estimated the prompt as characters / 4 and ignored `usage.prompt_tokens`:
Chinese text (about a token a character) was undercounted several-fold, so the threshold was
seen late and the provider's overflow came first. The model is the scripted model server (the
one allowed fake); the broker an `httpx.MockTransport` recording what the runner sends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from suzumio.contracts.ids import new_id
from suzumio.contracts.runner import AgentHistoryMessage, RunnerConfig
from suzumio.contracts.values import ModelSpec
from suzumio.runner.agent import AgentLoop, Ending
from suzumio.runner.broker import BrokerClient
from suzumio.runner.live import LiveStream
from suzumio.runner.loop import compaction
from suzumio.runner.model import Endpoint, ModelClient
from suzumio.runner.toolbox import Toolbox
from suzumio.runner.tools.base import ToolContext
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall, Usage
from tests.unit.loop_support import TOKEN, Broker, spec

# threshold = 0.5 x (20,000 - 4,096) = 7,952 tokens
CONFIG = RunnerConfig(context_window=20_000, max_output_tokens=4_096)
THRESHOLD = 7_952
CJK = "这个函数需要重构以便支持并发请求和错误处理" * 15  # 300 characters, ~300+ real tokens


def cjk_history(pairs: int = 12) -> tuple[AgentHistoryMessage, ...]:
    return tuple(
        AgentHistoryMessage(id=new_id(), role=role, content=f"{role} {i}: {CJK}")
        for i in range(pairs)
        for role in ("user", "assistant")
    )


def is_summariser(messages: list[dict[str, Any]]) -> bool:
    return "You compact the memory" in str(messages[0].get("content"))


async def run_loop(
    tmp_path: Path, replies: list[Reply], history: tuple[AgentHistoryMessage, ...]
) -> tuple[Ending, Broker, list[list[dict[str, Any]]]]:
    broker = Broker()
    http = httpx.AsyncClient(base_url="http://broker", transport=httpx.MockTransport(broker.answer))
    client = BrokerClient("http://broker", TOKEN, http=http)
    activation = spec(tmp_path, history=history).model_copy(update={"runner": CONFIG})
    (tmp_path / "a.txt").write_text("a\n")
    toolbox = Toolbox(activation, client, ToolContext(workspace=tmp_path))
    async with ScriptedModelServer() as server:
        server.script(replies)
        model = ModelClient(ModelSpec(name="primary"), Endpoint(f"{server.url}/v1", "k"))
        loop = AgentLoop(activation, client, [model], toolbox, LiveStream(client), [])
        try:
            ending = await loop.run()
        finally:
            await model.close()
            await http.aclose()
        requests = [r.messages for r in server.completion_requests]
    return ending, broker, requests


def read_a(call_id: str) -> ToolCall:
    return ToolCall("file_read", {"path": "a.txt"}, id=call_id)


async def test_the_providers_usage_over_the_threshold_compacts_before_the_next_call(
    tmp_path: Path,
) -> None:
    history = cjk_history()
    # The estimate sees about 2,400 tokens; the provider counted 9,000.
    assert compaction.estimate_tokens([{"role": "user", "content": CJK}] * 24) < THRESHOLD / 2
    replies = [
        Reply.tool_calls([read_a("r1")], usage=Usage(prompt_tokens=9_000, completion_tokens=20)),
        Reply.text("## Goal\nrefactor\n## Remaining work\nnone"),  # the summary
        Reply.text("done", usage=Usage(prompt_tokens=3_000, completion_tokens=5)),
    ]
    ending, broker, requests = await run_loop(tmp_path, replies, history)
    assert ending.reason == "completed", ending
    assert ending.usage["compactions"] == 1
    assert [is_summariser(m) for m in requests] == [False, True, False]
    assert any(compaction.is_summary(m) for m in requests[2])
    [marker] = broker.bodies["/runner/history/compaction"]
    assert marker["tokens_before"] >= 9_020  # the provider's count, not the estimate's
    assert marker["tokens_after"] < marker["tokens_before"]


async def test_usage_under_the_threshold_does_not_compact(tmp_path: Path) -> None:
    replies = [
        Reply.tool_calls([read_a("r1")], usage=Usage(prompt_tokens=3_000, completion_tokens=20)),
        Reply.text("done", usage=Usage(prompt_tokens=3_100, completion_tokens=5)),
    ]
    ending, _, requests = await run_loop(tmp_path, replies, cjk_history())
    assert ending.reason == "completed", ending
    assert ending.usage["compactions"] == 0
    assert not any(is_summariser(m) for m in requests)


async def test_the_anchor_is_dropped_after_a_compaction(tmp_path: Path) -> None:
    """After the compaction the provider's 9,000 counted messages that are gone: the next
    rounds (whose calls report no usage) are estimated, not measured from the stale count,
    even once the conversation is as long again as the count's messages were."""
    no_usage = Usage(prompt_tokens=0, completion_tokens=0)
    many = [read_a(f"m{i}") for i in range(20)]
    replies = [
        Reply.tool_calls([read_a("r1")], usage=Usage(prompt_tokens=9_000, completion_tokens=20)),
        Reply.text("## Goal\nrefactor\n## Remaining work\nnone"),  # the summary
        Reply.tool_calls(many, usage=no_usage),
        Reply.text("done", usage=no_usage),
    ]
    ending, _, requests = await run_loop(tmp_path, replies, cjk_history())
    assert ending.reason == "completed", ending
    assert ending.usage["compactions"] == 1
    assert [is_summariser(m) for m in requests] == [False, True, False, False]
    assert len(requests[3]) > len(requests[0]) + 1  # longer than what the stale count covered


# -- the measure itself -----------------------------------------------------------------------


def test_prompt_tokens_is_the_anchor_plus_an_estimate_of_what_came_after() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": CJK},
        {"role": "assistant", "content": CJK},
        {"role": "tool", "tool_call_id": "c", "content": "x" * 400},
    ]
    anchor = compaction.usage_anchor(2, {"prompt_tokens": 500, "completion_tokens": 300})
    assert anchor == compaction.UsageAnchor(messages=3, tokens=800)
    added = compaction.estimate_tokens(messages[3:])
    assert compaction.prompt_tokens(messages, anchor) == 800 + added


def test_without_completion_tokens_the_reply_is_estimated() -> None:
    anchor = compaction.usage_anchor(2, {"prompt_tokens": 500})
    assert anchor == compaction.UsageAnchor(messages=2, tokens=500)


def test_without_usage_the_estimate_stands() -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "x" * 4000}]
    assert compaction.usage_anchor(1, {}) is None
    assert compaction.usage_anchor(1, {"prompt_tokens": 0, "completion_tokens": 7}) is None
    assert compaction.prompt_tokens(messages, None) == compaction.estimate_tokens(messages)


def test_an_anchor_longer_than_the_messages_is_ignored() -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "x" * 40}]
    stale = compaction.UsageAnchor(messages=5, tokens=99_999)
    assert compaction.prompt_tokens(messages, stale) == compaction.estimate_tokens(messages)


# -- redaction of text without ASCII words ------------------------------------------------------


def test_redaction_keeps_long_runs_of_chinese_and_still_finds_keys_beside_them() -> None:
    """32+ Chinese characters without punctuation are `\\w` to Unicode regexes: they were taken
    for a random key, which has no ASCII word to measure, and the division by zero failed the
    summariser's request — every compaction of such a conversation."""
    key = "Zq8xP2vK9mW4rT7yB3nH6jL1cF5dG0sA"
    assert compaction.redact(CJK) == CJK
    assert compaction.redact("äöüß" * 10) == "äöüß" * 10
    assert key not in compaction.redact(f"密钥{key}已经泄露")
    request = compaction.summary_request([{"role": "user", "content": CJK}])
    assert CJK in str(request[1]["content"])


async def test_a_compaction_of_more_entries_than_a_marker_names_archives_what_it_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A marker names 10,000 archived entries at most (here 6): a longer middle failed to
    become one, and the activation crashed — every one of the session's, the history never
    changing. It archives what a marker can name, the rest left for the next compaction."""
    monkeypatch.setattr("suzumio.runner.agent.MAX_ARCHIVED", 6)
    replies = [
        Reply.tool_calls([read_a("r1")], usage=Usage(prompt_tokens=9_000, completion_tokens=20)),
        Reply.text("## Goal\nrefactor\n## Remaining work\nnone"),  # the summary
        Reply.text("done", usage=Usage(prompt_tokens=3_000, completion_tokens=5)),
    ]
    ending, broker, _ = await run_loop(tmp_path, replies, cjk_history())
    assert ending.reason == "completed", ending
    assert ending.usage["compactions"] == 1
    [marker] = broker.bodies["/runner/history/compaction"]
    assert 0 < len(marker["archived_ids"]) <= 6
