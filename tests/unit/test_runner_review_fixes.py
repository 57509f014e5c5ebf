"""The agent loop survives what a model or a workspace can throw at it: arguments that are
malformed in ways `json` reports with other exceptions than `JSONDecodeError`, file names that
are not UTF-8, and tool-call ids that an earlier activation of the session used already.

The model is the scripted model server (the one allowed fake) through the real openai SDK; the
broker is an `httpx.MockTransport`, so what is asserted is what the runner decides to send."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from suzumio.contracts.runner import (
    AgentHistoryMessage,
    RunnerActivationInput,
    RunnerToolpackSpec,
)
from suzumio.contracts.runner import ToolCall as HistoryCall
from suzumio.contracts.values import ModelSpec
from suzumio.runner.agent import AgentLoop, Ending, redact_cut_edges
from suzumio.runner.broker import BrokerClient
from suzumio.runner.live import LiveStream
from suzumio.runner.loop import compaction
from suzumio.runner.model import Endpoint, ModelClient
from suzumio.runner.toolbox import Toolbox
from suzumio.runner.tools.base import ToolContext, ToolLimits, printable
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from tests.unit.loop_support import TOKEN, Broker
from tests.unit.loop_support import spec as base_spec


def spec(
    workspace: Path, history: tuple[AgentHistoryMessage, ...] = (), packs: tuple[str, ...] = ()
) -> RunnerActivationInput:
    return base_spec(workspace, history, tuple(RunnerToolpackSpec(name=p) for p in packs))


async def run_loop(
    activation: RunnerActivationInput,
    replies: list[Reply],
    broker: Broker,
    ctx: ToolContext | None = None,
    secrets: tuple[str, ...] = (),
) -> tuple[Ending, ScriptedModelServer]:
    http = httpx.AsyncClient(base_url="http://broker", transport=httpx.MockTransport(broker.answer))
    client = BrokerClient("http://broker", TOKEN, http=http)
    ctx = ctx or ToolContext(workspace=Path(activation.workspace))
    toolbox = Toolbox(activation, client, ctx)
    async with ScriptedModelServer() as server:
        server.script(replies)
        model = ModelClient(ModelSpec(name="primary"), Endpoint(f"{server.url}/v1", "k"))
        loop = AgentLoop(activation, client, [model], toolbox, LiveStream(client), secrets)
        try:
            return await loop.run(), server
        finally:
            await model.close()
            await http.aclose()


# --- malformed arguments ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("[" * 5000, "nested more than 64 levels"),  # RecursionError inside json
        ('{"path": ' + "[" * 5000 + "}", "nested more than 64 levels"),
        ('{"path": ' + "[" * 100 + "]" * 100 + "}", "nested more than 64 levels"),  # parses
        ('{"path": "a", "offset": ' + "1" * 5000 + "}", "Exceeds the limit"),  # ValueError
        ("{not json", "not valid JSON"),
    ],
    ids=["deep-array", "deep-value", "deep-but-parsable", "huge-int", "broken"],
)
async def test_malformed_arguments_become_that_calls_error(
    tmp_path: Path, raw: str, says: str
) -> None:
    broker = Broker()
    replies = [Reply.tool_calls([ToolCall("file_read", raw)]), Reply.text("done")]
    ending, server = await run_loop(spec(tmp_path), replies, broker)
    assert ending.reason == "completed"
    [result] = broker.tool_results()
    assert says in result["text"]
    [finished] = broker.bodies["/runner/tool-calls/finish"]
    assert finished["status"] == "error"
    # The conversation goes on with arguments a provider can parse (some refused every later
    # request over one bad reply); the history keeps the same, with the start of what came.
    [asked] = [m for m in server.requests[1].messages if m["role"] == "assistant"]
    sent_back = json.loads(asked["tool_calls"][0]["function"]["arguments"])
    assert sent_back == {"invalid_arguments": raw[:2_000]}
    [entry] = [e for b in broker.bodies["/runner/history"] for e in b["entries"]
               if e["role"] == "assistant"]  # fmt: skip
    assert json.loads(entry["tool_calls"][0]["arguments"]) == sent_back


@pytest.mark.parametrize(
    "raw",
    ["[" * 5000, '{"path": ' + "[" * 5000 + "}", '{"path": "a", "offset": ' + "1" * 5000 + "}"],
    ids=["deep-array", "deep-value", "huge-int"],
)
def test_compaction_prunes_history_with_malformed_arguments(raw: str) -> None:
    """History written before the loop checked arguments can hold them: pruning it (the
    arguments are shortened, the result digested from them) must not crash compaction."""
    arguments = raw + " " * compaction.LARGE_ARGUMENTS_CHARS
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "file_read", "arguments": arguments},
    }
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "x" * 500},
        *(
            {"role": role, "content": f"later {i}"}
            for i in range(5)
            for role in ("user", "assistant")
        ),
    ]
    pruned = compaction.prune(messages, 100, min_tail_messages=2)
    shortened = pruned[3]["tool_calls"][0]["function"]["arguments"]
    assert len(shortened) < len(arguments)
    assert json.loads(shortened)
    assert pruned[4]["content"].startswith("[file.read] read -> 1 line")


# --- file names that are not UTF-8 -----------------------------------------------------------


def test_printable_escapes_lone_surrogates() -> None:
    assert printable("café") == "café"
    assert printable(os.fsdecode(b"caf\xe9.txt")) == "caf\\xe9.txt"
    assert printable("a\ud800b") == "a\\ud800b"


async def test_a_name_that_is_not_utf8_is_shown_escaped_and_audited(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    Path(os.fsdecode(os.fsencode(tmp_path / "d") + b"/caf\xe9.txt")).write_text("hello\n")
    (tmp_path / "d" / "ok.txt").write_text("hello\n")
    broker = Broker()
    calls = [ToolCall("file_read", {"path": "d"}), ToolCall("file_search", {"pattern": "hello"})]
    ending, _ = await run_loop(
        spec(tmp_path), [Reply.tool_calls(calls), Reply.text("done")], broker
    )
    assert ending.reason == "completed"
    listing, search = (r["text"] for r in broker.tool_results())
    assert listing.splitlines() == ["d/ (2 entries)", "caf\\xe9.txt", "ok.txt"]
    assert search.splitlines() == ["d/caf\\xe9.txt:1: hello", "d/ok.txt:1: hello"]
    finished = broker.bodies["/runner/tool-calls/finish"]
    assert [f["status"] for f in finished] == ["ok", "ok"]


# --- call ids across activations -------------------------------------------------------------


async def test_a_call_id_from_an_earlier_activation_is_not_reused(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("new\n")
    history = (
        AgentHistoryMessage(id="h" * 26, role="user", content="read a.txt"),
        AgentHistoryMessage(
            id="i" * 26,
            role="assistant",
            tool_calls=(HistoryCall(id="call_0", name="file.read", arguments='{"path": "a.txt"}'),),
        ),
        AgentHistoryMessage(id="j" * 26, role="tool", tool_call_id="call_0", content="old"),
    )
    broker = Broker()
    replies = [
        Reply.tool_calls([ToolCall("file_read", {"path": "a.txt"}, id="call_0")]),
        Reply.text("done"),
    ]
    ending, server = await run_loop(spec(tmp_path, history), replies, broker)
    assert ending.reason == "completed"
    [started] = broker.bodies["/runner/tool-calls/start"]
    assert started["call_id"] != "call_0"
    [result] = broker.tool_results()
    assert result["tool_call_id"] == started["call_id"]
    # The conversation the model saw next pairs each result with its own call.
    last = [r for r in server.requests if r.path.endswith("/chat/completions")][-1].json
    ids = [c["id"] for m in last["messages"] for c in m.get("tool_calls") or ()]
    assert len(ids) == len(set(ids)) == 2


async def test_a_call_with_no_tool_name_is_audited_and_told_to_the_model(tmp_path: Path) -> None:
    """Its audit start was refused by the runner's own check (a tool's name may not be
    empty): the call was never recorded, and the model heard only of a failure. And it goes
    back to the model under a name providers take."""
    broker = Broker()
    replies = [Reply.tool_calls([ToolCall("", {"path": "a.txt"}, id="c1")]), Reply.text("done")]
    ending, server = await run_loop(spec(tmp_path), replies, broker)
    assert ending.reason == "completed"
    # Sent back (and kept in the history) under a name providers take: OpenAI and Gemini
    # refused every later request of the session over a call named "".
    last = [r for r in server.requests if r.path.endswith("/chat/completions")][-1].json
    sent = [c["function"]["name"] for m in last["messages"] for c in m.get("tool_calls") or ()]
    assert sent == ["unnamed_tool"]
    [assistant] = [e for b in broker.bodies["/runner/history"] for e in b["entries"]
                   if e["role"] == "assistant"]  # fmt: skip
    assert [c["name"] for c in assistant["tool_calls"]] == ["unnamed_tool"]
    [started] = broker.bodies["/runner/tool-calls/start"]
    assert (started["call_id"], started["tool"]) == ("c1", "(no name)")
    [finished] = broker.bodies["/runner/tool-calls/finish"]
    assert (finished["call_id"], finished["status"]) == ("c1", "error")
    [result] = broker.tool_results()
    assert result["text"] == "a tool call without a name"


async def test_a_call_named_what_providers_refuse_goes_back_named_as_they_take(
    tmp_path: Path,
) -> None:
    """A name outside `^[A-Za-z0-9_-]{1,64}$` (OpenAI's own `multi_tool_use.parallel`, a name
    with spaces) went back to the model as it came, which refuses such a conversation."""
    broker = Broker()
    replies = [
        Reply.tool_calls([ToolCall("multi_tool_use.parallel", {}, id="c1")]),
        Reply.text("done"),
    ]
    ending, server = await run_loop(spec(tmp_path), replies, broker)
    assert ending.reason == "completed"
    last = [r for r in server.requests if r.path.endswith("/chat/completions")][-1].json
    sent = [c["function"]["name"] for m in last["messages"] for c in m.get("tool_calls") or ()]
    assert sent == ["multi_tool_use_parallel"]
    [started] = broker.bodies["/runner/tool-calls/start"]
    assert started["tool"] == "multi_tool_use.parallel"  # the audit keeps what the model said


# --- secrets cut in half ---------------------------------------------------------------------

SECRET = "sk-secret-0123456789abcdef"


async def test_a_secret_cut_by_a_tool_leaves_no_fragment(tmp_path: Path) -> None:
    """Tools cut their output before the loop redacts it: a secret straddling the cut no
    longer matched and its halves went out. 20 characters, then the secret, at the start of
    each output, and the secret, then 20 characters, at the end of the shell's."""
    text = "x" * 20 + SECRET + "z" * 500 + SECRET + "w" * 20
    (tmp_path / "out.txt").write_text(text)

    async def page(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        head = f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(text)}\r\n"
        writer.write(head.encode() + b"Connection: close\r\n\r\n" + text.encode())
        await writer.drain()
        writer.close()

    listener = await asyncio.start_server(page, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}/"
    ctx = ToolContext(
        workspace=tmp_path,
        limits=ToolLimits(shell_output_max_bytes=64, read_max_bytes=40, fetch_max_bytes=32),
        allow_private_network=True,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    calls = [
        ToolCall("shell_exec", {"command": "cat out.txt"}),
        ToolCall("file_read", {"path": "out.txt"}),
        ToolCall("web_fetch", {"url": url}),
    ]
    broker = Broker()
    try:
        ending, _ = await run_loop(
            spec(tmp_path, packs=("files", "shell", "web")),
            [Reply.tool_calls(calls), Reply.text("done")],
            broker,
            ctx,
            (SECRET,),
        )
    finally:
        listener.close()
    assert ending.reason == "completed"
    shell, read, fetch = (r["text"] for r in broker.tool_results())
    assert shell.startswith(
        "x" * 20 + "[redacted]\n[... 528 bytes omitted ...]\n[redacted]" + "w" * 20 + "\n\n[exit 0"
    )
    assert "x" * 20 + "[redacted]\n[line 1 cut]" in read
    assert fetch.endswith("x" * 20 + "[redacted]\n[truncated at 32 bytes]")
    sent = json.dumps(broker.bodies)
    for fragment in (SECRET[:6], SECRET[-6:]):
        assert fragment not in sent


# --- live output of a retried call -----------------------------------------------------------


async def test_live_viewers_are_told_to_drop_a_retried_attempts_text(tmp_path: Path) -> None:
    """A reply cut off by the output cap is asked for again; its streamed text must not simply
    run on into the retry's, or viewers read the answer twice."""
    broker = Broker()
    http = httpx.AsyncClient(base_url="http://broker", transport=httpx.MockTransport(broker.answer))
    client = BrokerClient("http://broker", TOKEN, http=http)
    activation = spec(tmp_path)
    toolbox = Toolbox(activation, client, ToolContext(workspace=tmp_path))
    live = LiveStream(client)
    live.start()
    async with ScriptedModelServer() as server:
        server.script([Reply.text("the first half", finish_reason="length"), Reply.text("whole")])
        model = ModelClient(ModelSpec(name="primary"), Endpoint(f"{server.url}/v1", "k"))
        loop = AgentLoop(activation, client, [model], toolbox, live, [])
        try:
            ending = await loop.run()
            await live.close()
        finally:
            await model.close()
            await http.aclose()
    assert ending.text == "whole"
    chunks = [c for b in broker.bodies["/runner/stream"] for c in b["chunks"]]
    texts = [c["text"] for c in chunks if c["kind"] == "text"]
    assert "".join(texts) == "the first halfwhole"
    first = next(i for i, c in enumerate(chunks) if c["kind"] == "text")
    last = max(i for i, c in enumerate(chunks) if c["kind"] == "text")
    between = [c for c in chunks[first:last] if c["kind"] == "state"]
    assert any(c["data"].get("discard") is True for c in between)


def test_a_secret_clipped_in_a_search_result_leaves_no_fragment() -> None:
    secret = "sk-proj-9f8e7d6c5b4a3210"
    line = "config.env:3: " + "x" * 280 + secret[:12] + " [...]"
    cleaned = redact_cut_edges(f"{line}\nconfig.env:4: ok", [secret])
    assert secret[:8] not in cleaned
    assert cleaned.endswith("[redacted] [...]\nconfig.env:4: ok")
