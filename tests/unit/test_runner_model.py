"""The runner's model client reads the stream's chunks as JSON: what it puts together, through
the real `openai` SDK, from the scripted model server (the suite's one fake provider) and from
a raw server sending chunks no real provider should."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from suzumio.contracts.values import ModelSpec
from suzumio.runner.connections import model_http, sdk_client
from suzumio.runner.model import (
    Endpoint,
    ModelClient,
    ModelTurn,
    StreamCutShortError,
    StreamEventTooLargeError,
)
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall, Usage
from tests.unit.loop_support import run_loop, spec

HELLO = [{"role": "user", "content": "hello"}]


async def _complete(url: str) -> tuple[ModelTurn, list[str]]:
    pieces: list[str] = []
    client = ModelClient(ModelSpec(name="m"), Endpoint(url, "test"))
    try:
        return await client.complete(HELLO, [], 100, pieces.append), pieces
    finally:
        await client.close()


async def test_text_usage_and_finish_come_together_from_the_chunks() -> None:
    text = "The quick brown fox jumps over the lazy dog."
    async with ScriptedModelServer() as server:
        server.script([Reply.text(text, usage=Usage(prompt_tokens=10, completion_tokens=3))])
        turn, pieces = await _complete(server.url + "/v1")
    assert len(pieces) >= 5  # as they came
    assert "".join(pieces) == text
    assert (turn.text, turn.finish_reason, turn.tool_calls) == (text, "stop", [])
    assert turn.usage == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}


async def test_parallel_tool_calls_are_put_together_from_their_fragments() -> None:
    read = {"path": "src/app.py", "range": {"start": 1, "end": 40}}
    search = {"pattern": "TODO", "paths": ["src", "tests"]}
    async with ScriptedModelServer() as server:
        server.script(
            [
                Reply.tool_calls(
                    [ToolCall("file_read", read), ToolCall("file_search", search, id="c2")]
                )
            ]
        )
        turn, pieces = await _complete(server.url + "/v1")
    calls = turn.tool_calls
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("file_read", read),
        ("file_search", search),
    ]
    assert calls[1].id == "c2"
    assert calls[0].id
    assert (turn.finish_reason, pieces) == ("tool_calls", [])


def _sse(*events: bytes) -> bytes:
    body = b"".join(b"data: " + e + b"\n\n" for e in events)
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
    )


@contextlib.asynccontextmanager
async def _raw(response: bytes, *, hold: bool = False) -> AsyncIterator[str]:
    """A server answering every request with `response`, then closing the connection (with
    `hold`, keeping it open until the test ends)."""
    held: list[asyncio.StreamWriter] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        writer.write(response)
        await writer.drain()
        if hold:
            held.append(writer)
        else:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    finally:
        for writer in held:
            writer.close()
        server.close()


WHOLE = json.dumps({"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]})


def _claiming(length: int, body: bytes) -> bytes:
    """A streamed answer whose head claims `length` bytes, with `body` sent of them."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n"
    return head % length + body


DONE_BODY = b"data: " + WHOLE.encode() + b"\n\ndata: [DONE]\n\n"


@pytest.mark.parametrize(
    ("response", "hold"),
    [
        (_sse(WHOLE.encode(), b"[DONE]"), False),
        (_sse(WHOLE.encode(), b"[DONE]", b'{"choices": "not read"}'), False),
        (_claiming(len(DONE_BODY) + 100, DONE_BODY), False),  # cut short after [DONE]
        (_claiming(len(DONE_BODY) + 100, DONE_BODY), True),  # never ends after [DONE]
    ],
    ids=["nothing after", "an event after", "cut short after", "held open after"],
)
async def test_a_reply_is_whole_at_done_whatever_follows(
    response: bytes, hold: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner reads a stream's rest after `[DONE]` itself, for a moment (`model._read_out`),
    so that the SDK's drain finds the response closed; what comes after, a body cut short or
    one that never ends, changes nothing: the reply came whole."""
    drained: list[bool] = []
    sdk_drain = openai._streaming_cleanup.drain_response_async

    async def drain(response: Any) -> None:
        drained.append(response.is_closed)
        await sdk_drain(response)

    monkeypatch.setattr(openai._streaming, "drain_response_async", drain)
    async with _raw(response, hold=hold) as url:
        turn, pieces = await _complete(url)
    assert (turn.text, turn.finish_reason, pieces) == ("ok", "stop", ["ok"])
    assert drained == [True]  # read out (or given up on, held open): closed before its drain


async def test_a_chunk_that_is_not_an_object_fails_the_call() -> None:
    first = json.dumps({"choices": [{"index": 0, "delta": {"content": "hi"}}]}).encode()
    async with _raw(_sse(first, b"[1, 2]", b"[DONE]")) as url:
        with pytest.raises(openai.APIResponseValidationError):
            await _complete(url)


async def test_an_error_event_mid_stream_fails_the_call_with_its_message() -> None:
    first = json.dumps({"choices": [{"index": 0, "delta": {"content": "hi"}}]}).encode()
    error = json.dumps({"error": {"message": "overloaded, try later"}}).encode()
    async with _raw(_sse(first, error, b"[DONE]")) as url:
        with pytest.raises(openai.APIError, match="overloaded, try later"):
            await _complete(url)


async def test_fields_of_the_wrong_kind_are_left_out_not_guessed() -> None:
    odd = json.dumps(
        {
            "choices": [
                {"index": 0, "delta": {"content": 7, "tool_calls": "x"}, "finish_reason": None},
                "not a choice",
                {"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"},
            ],
            "usage": {"prompt_tokens": "many", "completion_tokens": 2, "total_tokens": 2},
        }
    ).encode()
    async with _raw(_sse(odd, b"[DONE]")) as url:
        turn, pieces = await _complete(url)
    assert (turn.text, turn.finish_reason, turn.tool_calls, pieces) == ("ok", "stop", [], ["ok"])
    assert turn.usage == {"prompt_tokens": 0, "completion_tokens": 2, "total_tokens": 2}


async def test_tool_call_deltas_without_an_index_go_on_with_the_call_they_follow() -> None:
    def delta(**call: object) -> bytes:
        return json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}).encode()

    events = (
        delta(id="a", function={"name": "file_read", "arguments": '{"pa'}),
        delta(function={"arguments": 'th": "x"}'}),
        delta(id="b", function={"name": "file_search", "arguments": "{}"}),
    )
    async with _raw(_sse(*events, b"[DONE]")) as url:
        turn, _ = await _complete(url)
    assert [(c.id, c.name, json.loads(c.arguments)) for c in turn.tool_calls] == [
        ("a", "file_read", {"path": "x"}),
        ("b", "file_search", {}),
    ]


async def test_deltas_without_an_index_that_repeat_their_calls_id_stay_that_call() -> None:
    """Each delta of a call taken for a new call by its id: the call came apart into its
    named start and nameless fragments of its arguments (which could not even be audited)."""

    def delta(**call: object) -> bytes:
        return json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}).encode()

    events = (
        delta(id="a", function={"name": "file_read", "arguments": '{"pa'}),
        delta(id="a", function={"arguments": 'th": "x"}'}),
        delta(id="b", function={"name": "file_search", "arguments": '{"pattern":'}),
        delta(id="a", function={"arguments": ""}),  # an earlier call's id: that call
        delta(id="b", function={"arguments": ' "y"}'}),
        delta(id="b3", function={"arguments": ""}),  # a fresh id, no name: the call it follows
    )
    async with _raw(_sse(*events, b"[DONE]")) as url:
        turn, _ = await _complete(url)
    assert [(c.id, c.name, json.loads(c.arguments)) for c in turn.tool_calls] == [
        ("a", "file_read", {"path": "x"}),
        ("b", "file_search", {"pattern": "y"}),
    ]


@pytest.mark.parametrize("index", [None, 0], ids=["without_index", "with_index"])
async def test_a_call_whose_name_comes_again_with_every_chunk_is_named_once(
    index: int | None,
) -> None:
    """A server that sends the call's name again with every chunk: it was doubled
    (`file_readfile_read`), a tool nobody has."""

    def delta(**call: object) -> bytes:
        body = call if index is None else {"index": index, **call}
        return json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [body]}}]}).encode()

    events = (
        delta(id="a", function={"name": "file_read", "arguments": '{"pa'}),
        delta(id="a", function={"name": "file_read", "arguments": 'th": "x"}'}),
    )
    async with _raw(_sse(*events, b"[DONE]")) as url:
        turn, _ = await _complete(url)
    assert [(c.id, c.name, json.loads(c.arguments)) for c in turn.tool_calls] == [
        ("a", "file_read", {"path": "x"}),
    ]


async def test_parallel_calls_streamed_under_one_index_stay_apart_by_their_ids() -> None:
    """Ollama and some vLLM builds stream every parallel call at index 0, each with its own
    id: joined, they made one call nobody made (`file_readfile_search`, `{..}{..}`)."""

    def delta(**call: object) -> bytes:
        body = {"index": 0, **call}
        return json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [body]}}]}).encode()

    events = (
        delta(id="a", function={"name": "file_read", "arguments": '{"path":'}),
        delta(function={"arguments": ' "x"}'}),
        delta(id="b", function={"name": "file_search", "arguments": '{"pattern": "y"}'}),
        delta(id="b", function={"arguments": ""}),  # the same id again: still that call
        delta(id="b2", function={"arguments": ""}),  # a fresh id, no name: still that call
    )
    async with _raw(_sse(*events, b"[DONE]")) as url:
        turn, _ = await _complete(url)
    assert [(c.id, c.name, json.loads(c.arguments)) for c in turn.tool_calls] == [
        ("a", "file_read", {"path": "x"}),
        ("b", "file_search", {"pattern": "y"}),
    ]


async def test_the_body_reaches_the_model_as_the_json_it_was() -> None:
    """Encoded by orjson, not the SDK: the same JSON, non-ASCII text and escapes included, as
    `application/json`; a schema orjson cannot encode (an integer past 64 bits) goes through
    the SDK's own encoder instead of failing the call."""
    messages = [
        {"role": "system", "content": 'Antworte kurz. 短く答えて。 "quoted" \\ \n\t\u2028'},
        {"role": "user", "content": "emoji 🦊, nul-free, <tags> & more"},
    ]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "file_read",
                "description": "Read a file",
                "parameters": {
                    "type": "object",
                    "properties": {"path": {"type": "string"}, "n": {"maximum": 1.5e300}},
                },
            },
        }
    ]
    huge = [{**tools[0], "function": {"name": "f", "parameters": {"maximum": 2**70}}}]
    endless = [{**tools[0], "function": {"name": "f", "parameters": {"maximum": math.inf}}}]
    async with ScriptedModelServer() as server:
        server.script([Reply.text("one"), Reply.text("two"), Reply.text("three")])
        client = ModelClient(ModelSpec(name="m"), Endpoint(server.url + "/v1", "test"))
        try:
            assert (await client.complete(messages, tools, 100)).text == "one"
            assert (await client.complete(messages, huge, 100)).text == "two"
            # Documented (`model`): a non-finite number, which JSON cannot hold, goes as null.
            assert (await client.complete(messages, endless, 100)).text == "three"
        finally:
            await client.close()
    first, second, third = server.completion_requests
    assert first.headers["content-type"] == "application/json"
    assert first.body == {
        "model": "m",
        "messages": messages,
        "max_tokens": 100,
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": tools,
    }
    assert second.body is not None
    assert second.body["tools"] == huge
    assert third.body is not None
    assert third.body["tools"][0]["function"]["parameters"] == {"maximum": None}


async def test_a_client_given_another_base_url_calls_it() -> None:
    """The SDK client makes a path's URL once (`connections._SdkClient`), but never keeps one
    made with a base URL it no longer has."""
    async with ScriptedModelServer() as a, ScriptedModelServer() as b:
        a.script([Reply.text("a")])
        b.script([Reply.text("b")])
        http = model_http()
        sdk = sdk_client(a.url + "/v1", "test", 30, http)
        try:
            for server in (a, b):
                sdk.base_url = server.url + "/v1"
                await sdk.chat.completions.create(model="m", messages=HELLO)  # type: ignore[arg-type]
        finally:
            await http.aclose()
    assert [r.path for r in a.completion_requests] == ["/v1/chat/completions"]
    assert [r.path for r in b.completion_requests] == ["/v1/chat/completions"]


async def test_each_call_sends_its_own_body_with_the_headers_the_sdk_makes() -> None:
    """The SDK client makes a request but its body once (`connections._SdkClient`): each call
    still sends its own body with its own length, the headers the SDK itself makes for it,
    the cookies the provider set since, and the key the client has now."""
    async with ScriptedModelServer() as server:
        server.script(
            [
                Reply.text("one", headers={"set-cookie": "__cf_bm=abc; Path=/"}),
                Reply.text("two", headers={"set-cookie": "__cf_bm=def; Path=/"}),
                Reply.text("three", headers={"set-cookie": "__cf_bm=ghi; Path=/"}),
                Reply.text("four"),
            ]
        )
        model = ModelClient(ModelSpec(name="m"), Endpoint(server.url + "/v1", "first"))
        reference = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="first")
        try:
            short = [{"role": "user", "content": "hi"}]
            long = [{"role": "user", "content": "a longer message " * 50}]
            assert (await model.complete(short, [], 100)).text == "one"
            assert (await model.complete(long, [], 100)).text == "two"
            model.use_key("second")  # a client of its own, made with cookies kept already
            assert (await model.complete(short, [], 100)).text == "three"
            assert (await model.complete(long, [], 100)).text == "four"
            options = openai._models.FinalRequestOptions.construct(
                method="post", url="/chat/completions", json_data={"x": 1},
                security={"bearer_auth": True},
            )  # fmt: skip
            made = reference._build_request(options)
        finally:
            await model.close()
            await reference.close()
    first, second, third, fourth = server.completion_requests
    assert [r.messages for r in (first, second, third, fourth)] == [short, long, short, long]
    for request in (first, second, third, fourth):
        assert request.headers["content-length"] == str(len(orjson.dumps(request.body)))
    sdk_headers = {k.lower() for k in made.headers} - {"content-length", "cookie"}
    assert sdk_headers <= set(second.headers), sdk_headers - set(second.headers)
    assert second.headers["x-stainless-retry-count"] == made.headers["x-stainless-retry-count"]
    assert "cookie" not in first.headers
    # Each request with the cookies as they are then: set, rotated, rotated again.
    assert [r.headers["cookie"] for r in (second, third, fourth)] == [
        "__cf_bm=abc",
        "__cf_bm=def",
        "__cf_bm=ghi",
    ]
    keys = [r.headers["authorization"] for r in (first, second, third, fourth)]
    assert keys == ["Bearer first", "Bearer first", "Bearer second", "Bearer second"]


async def test_a_stream_that_ends_with_no_finish_reason_and_no_done_was_cut_short() -> None:
    """An upstream that failed mid-reply behind a proxy that closed the response cleanly:
    what came was taken for the whole answer, half a sentence recorded as the reply."""
    first = json.dumps({"choices": [{"index": 0, "delta": {"content": "The answer is"}}]})
    async with _raw(_sse(first.encode())) as url:
        with pytest.raises(StreamCutShortError):
            await _complete(url)


async def test_a_finish_reason_without_done_is_a_whole_reply() -> None:
    whole = json.dumps(
        {"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]}
    )
    async with _raw(_sse(whole.encode())) as url:
        turn, _ = await _complete(url)
    assert (turn.text, turn.finish_reason) == ("ok", "stop")


async def test_the_loop_asks_again_for_a_reply_whose_stream_was_cut_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("suzumio.runner.agent.backoff_seconds", lambda *_: 0.0)
    answer = "one two three four"
    run = await run_loop(
        tmp_path, spec(tmp_path), [Reply.text(answer, end_after=2), Reply.text(answer)]
    )
    assert (run.ending.reason, run.ending.text) == ("completed", answer)
    assert len(run.model_requests) == 2


async def test_an_endless_line_is_cut_off_at_the_event_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stream of one `data:` line that never ends parses into no chunk, so no bound of the
    reply counted it, and the idle timer (reset by nothing) let it run for 600 s, holding all
    of it in memory. It fails at the event bound, as a transport failure (retried)."""
    monkeypatch.setattr("suzumio.runner.model.MAX_EVENT_BYTES", 1 << 20)
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(head + b"data: ")
        for _ in range(64):  # 4 MiB of one line, and the connection held open
            writer.write(b"x" * (64 << 10))
            await writer.drain()
        await asyncio.sleep(60)

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    try:
        with pytest.raises(StreamEventTooLargeError):
            await asyncio.wait_for(_complete(url), 30)
    finally:
        server.close()
