"""The scripted model server and the offline demo model, driven through the real `openai` SDK
(this is the one fake provider of the test suite, DESIGN.md §13)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam
from pydantic import ValidationError

from suzumio.testing.model_server import (
    DEMO_MODEL_NAME,
    LABEL,
    DemoModel,
    Reply,
    ScriptedModelServer,
    ToolCall,
    Usage,
    load_script,
)

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]


@pytest_asyncio.fixture
async def server() -> AsyncIterator[ScriptedModelServer]:
    async with ScriptedModelServer() as started:
        yield started


@pytest_asyncio.fixture
async def client(server: ScriptedModelServer) -> AsyncIterator[openai.AsyncOpenAI]:
    sdk = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="test", max_retries=0)
    yield sdk
    await sdk.close()


def tool(name: str) -> ChatCompletionToolParam:
    parameters: dict[str, object] = {"type": "object", "properties": {"path": {"type": "string"}}}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


async def ask(client: openai.AsyncOpenAI, model: str = "m") -> str | None:
    completion = await client.chat.completions.create(model=model, messages=HELLO)
    return completion.choices[0].message.content


async def stream_chunks(client: openai.AsyncOpenAI, **kwargs: Any) -> list[Any]:
    stream = await client.chat.completions.create(model="m", messages=HELLO, stream=True, **kwargs)
    return [chunk async for chunk in stream]


# --- answers ------------------------------------------------------------------------------


async def test_streamed_text_comes_in_several_chunks_then_usage(server, client) -> None:
    text = "The quick brown fox jumps over the lazy dog."
    server.script([Reply.text(text, usage=Usage(prompt_tokens=10, completion_tokens=3))])

    chunks = await stream_chunks(client, stream_options={"include_usage": True})

    pieces = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert len(pieces) >= 5
    assert "".join(pieces) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (10, 3)
    assert chunks[-1].usage.total_tokens == 13


async def test_streamed_parallel_tool_calls_reassemble_to_the_scripted_arguments(
    server, client
) -> None:
    read = {"path": "src/app.py", "range": {"start": 1, "end": 40}}
    search = {"pattern": "TODO", "paths": ["src", "tests"], "regex": False}
    server.script(
        [Reply.tool_calls([ToolCall("file_read", read), ToolCall("file_search", search, id="c2")])]
    )

    chunks = await stream_chunks(client)

    calls: dict[int, dict[str, Any]] = {}
    fragments: dict[int, int] = {}
    for chunk in chunks:
        for delta in chunk.choices[0].delta.tool_calls or []:
            if delta.id is not None:  # the opening delta of a call names it
                assert delta.function is not None
                calls[delta.index] = {"id": delta.id, "name": delta.function.name, "args": ""}
            elif delta.function is not None and delta.function.arguments:
                calls[delta.index]["args"] += delta.function.arguments
                fragments[delta.index] = fragments.get(delta.index, 0) + 1
    assert [calls[i]["name"] for i in sorted(calls)] == ["file_read", "file_search"]
    assert calls[1]["id"] == "c2"
    assert calls[0]["id"]
    assert json.loads(calls[0]["args"]) == read
    assert json.loads(calls[1]["args"]) == search
    assert min(fragments.values()) > 1  # arguments really arrive in pieces
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_a_non_streamed_answer_carries_tool_calls_and_usage(server, client) -> None:
    server.script(
        [
            Reply.tool_calls(
                [
                    ToolCall("file_read", {"path": "a.txt"}),
                    ToolCall("file_read", {"path": "b.txt"}),
                ],
                usage=Usage(prompt_tokens=7, completion_tokens=2, cached_tokens=5),
            )
        ]
    )

    completion = await client.chat.completions.create(model="m", messages=HELLO)

    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert [json.loads(c.function.arguments) for c in calls if c.type == "function"] == [
        {"path": "a.txt"},
        {"path": "b.txt"},
    ]
    assert len({c.id for c in calls}) == 2
    assert completion.usage is not None
    assert completion.usage.total_tokens == 9
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 5


@pytest.mark.parametrize("finish_reason", ["length", "content_filter"])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_cut_off_answer_reports_its_finish_reason(
    server, client, finish_reason: str, stream: bool
) -> None:
    server.script([Reply.text("partial answer", finish_reason=finish_reason)])
    if stream:
        chunks = await stream_chunks(client)
        assert chunks[-1].choices[0].finish_reason == finish_reason
    else:
        completion = await client.chat.completions.create(model="m", messages=HELLO)
        assert completion.choices[0].finish_reason == finish_reason
        assert completion.choices[0].message.content == "partial answer"


# --- errors -------------------------------------------------------------------------------

ERRORS = [
    (Reply.context_length_exceeded(), openai.BadRequestError, 400, "context_length_exceeded"),
    (Reply.content_policy(), openai.BadRequestError, 400, "content_policy_violation"),
    (Reply.unauthorized(), openai.AuthenticationError, 401, "invalid_api_key"),
    (Reply.forbidden(), openai.PermissionDeniedError, 403, "forbidden"),
    (Reply.model_not_found("primary"), openai.NotFoundError, 404, "model_not_found"),
    (Reply.payload_too_large(), openai.APIStatusError, 413, "request_too_large"),
    (Reply.rate_limited(2), openai.RateLimitError, 429, "rate_limit_exceeded"),
    (Reply.server_error(), openai.InternalServerError, 500, None),
    (Reply.overloaded(retry_after=5), openai.InternalServerError, 503, None),
]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(
    ("reply", "exc_type", "status", "code"), ERRORS, ids=[f"{e[2]}-{e[3]}" for e in ERRORS]
)
async def test_an_error_step_raises_the_sdks_exception_for_that_status(
    server, client, reply: Reply, exc_type: type[openai.APIStatusError], status, code, stream
) -> None:
    server.script([reply])

    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(model="primary", messages=HELLO, stream=stream)

    assert type(caught.value) is exc_type
    assert caught.value.status_code == status
    assert caught.value.body == reply.body["error"]
    assert caught.value.code == code
    assert caught.value.response.headers.get("retry-after") == reply.headers.get("Retry-After")


async def test_error_bodies_say_what_went_wrong(server, client) -> None:
    server.script([Reply.context_length_exceeded(max_tokens=8192), Reply.model_not_found("gpt-x")])
    with pytest.raises(openai.BadRequestError, match="maximum context length is 8192"):
        await ask(client)
    with pytest.raises(openai.NotFoundError, match="gpt-x"):
        await ask(client)


async def test_rate_limit_carries_retry_after(server, client) -> None:
    server.script([Reply.rate_limited(retry_after=1)])
    with pytest.raises(openai.RateLimitError) as caught:
        await ask(client)
    assert caught.value.response.headers["retry-after"] == "1"


async def test_a_raw_error_step_sends_its_body_and_headers_as_given(server, client) -> None:
    server.script([Reply.error(502, "<html>bad gateway</html>", headers={"X-Upstream": "down"})])
    with pytest.raises(openai.InternalServerError) as caught:
        await ask(client)
    assert caught.value.status_code == 502
    assert caught.value.response.text == "<html>bad gateway</html>"
    assert caught.value.response.headers["x-upstream"] == "down"


# --- scripts ------------------------------------------------------------------------------


async def test_each_model_plays_its_own_script_and_others_share_one(server, client) -> None:
    server.script([Reply.model_not_found("primary")], model="primary")
    server.script([Reply.text("from backup")], model="backup")
    server.script([Reply.text("shared")])

    with pytest.raises(openai.NotFoundError):
        await ask(client, "primary")
    assert await ask(client, "backup") == "from backup"
    assert await ask(client, "anything") == "shared"
    with pytest.raises(openai.InternalServerError, match="script exhausted"):
        await ask(client, "primary")  # its own queue is empty: it never takes shared steps
    assert [r.model for r in server.requests] == ["primary", "backup", "anything", "primary"]


async def test_an_exhausted_script_answers_a_loud_500(server, client) -> None:
    server.script([Reply.text("only one")])
    assert await ask(client) == "only one"
    with pytest.raises(openai.InternalServerError) as caught:
        await ask(client)
    assert caught.value.code == "script_exhausted"
    assert "script exhausted" in str(caught.value)
    assert server.pending() == 0


async def test_callable_steps_answer_from_the_request(server, client) -> None:
    def echo(body: dict[str, Any]) -> Reply:
        return Reply.text(f"{body['model']} heard {body['messages'][-1]['content']}")

    async def slow_echo(body: dict[str, Any]) -> Reply:
        await asyncio.sleep(0)
        return Reply.text(f"async {len(body['messages'])}")

    def broken(body: dict[str, Any]) -> Reply:
        raise KeyError("nope")

    server.script([echo, slow_echo, broken])

    assert await ask(client, "m1") == "m1 heard hello"
    assert await ask(client) == "async 1"
    with pytest.raises(openai.InternalServerError, match="KeyError"):
        await ask(client)


async def test_the_default_responder_answers_after_the_script(server, client) -> None:
    server.default = Reply.text("fallback")
    server.script([Reply.text("first")])
    assert [await ask(client), await ask(client), await ask(client)] == [
        "first",
        "fallback",
        "fallback",
    ]


async def test_a_json_script_file_plays_like_the_python_one(server, client, tmp_path) -> None:
    path = tmp_path / "script.json"
    path.write_text(
        json.dumps(
            {
                "steps": [
                    {"text": "hi", "usage": {"prompt_tokens": 4, "completion_tokens": 1}},
                    {"tool_calls": [{"name": "file_read", "arguments": {"path": "x"}}]},
                    {"error": "rate_limited", "retry_after": 3},
                ],
                "models": {"primary": [{"error": "model_not_found", "model": "primary"}]},
                "default": {"status": 418, "body": {"error": {"message": "teapot"}}},
            }
        )
    )
    server.load_script(path)

    first = await client.chat.completions.create(model="m", messages=HELLO)
    assert first.choices[0].message.content == "hi"
    assert first.usage is not None
    assert first.usage.total_tokens == 5
    second = await client.chat.completions.create(model="m", messages=HELLO)
    assert second.choices[0].finish_reason == "tool_calls"
    with pytest.raises(openai.RateLimitError) as limited:
        await ask(client)
    assert limited.value.response.headers["retry-after"] == "3"
    with pytest.raises(openai.NotFoundError, match="primary"):
        await ask(client, "primary")
    with pytest.raises(openai.APIStatusError, match="teapot"):
        await ask(client)


def test_a_json_step_must_be_exactly_one_kind(tmp_path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"text": "hi", "error": "server_error"}]))
    with pytest.raises(ValidationError, match="exactly one of"):
        load_script(path)
    path.write_text(json.dumps([{"txt": "typo"}]))
    with pytest.raises(ValidationError):
        load_script(path)


# --- recording and timing -----------------------------------------------------------------


async def test_every_request_is_recorded_with_headers_and_body(server, client) -> None:
    server.script([Reply.text("ok")])
    await client.chat.completions.create(
        model="m", messages=HELLO, tools=[tool("file_read")], temperature=0.5
    )
    await client.models.list()

    chat, models = await server.wait_for_requests(2, timeout=1)
    assert (chat.method, chat.path, models.method, models.path) == (
        "POST",
        "/v1/chat/completions",
        "GET",
        "/v1/models",
    )
    assert chat.headers["authorization"] == "Bearer test"
    assert chat.body["temperature"] == 0.5
    assert chat.messages == [{"role": "user", "content": "hello"}]
    assert chat.tool_names == ["file_read"]
    assert not chat.stream
    assert server.completion_requests == [chat]


async def test_a_request_is_visible_while_its_answer_is_delayed(server, client) -> None:
    server.script([Reply.text("late", delay=0.5)])
    pending = asyncio.create_task(ask(client))

    (request,) = await server.wait_for_requests(1, timeout=0.4)

    assert request.model == "m"
    assert not pending.done()
    assert await pending == "late"
    with pytest.raises(TimeoutError, match="expected 2 requests"):
        await server.wait_for_requests(2, timeout=0.05)


async def test_delays_run_in_parallel_and_peak_concurrency_is_counted(server, client) -> None:
    server.script([Reply.text(f"answer {i}", delay=0.3) for i in range(3)])

    answers = await asyncio.gather(*(ask(client) for _ in range(3)))

    assert sorted(a or "" for a in answers) == ["answer 0", "answer 1", "answer 2"]
    assert server.peak_in_flight == 3  # all three delays overlapped: they ran in parallel
    assert server.in_flight == 0


async def test_a_slow_answer_times_the_client_out_and_the_server_still_closes_fast() -> None:
    async with ScriptedModelServer() as server:
        server.script([Reply.text("too late", delay=10)])
        async with openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="test", max_retries=0, timeout=0.2
        ) as client:
            with pytest.raises(openai.APITimeoutError):
                await ask(client)
        started = time.monotonic()
    assert time.monotonic() - started < 1.5


async def test_chunk_delay_spaces_the_chunks_of_a_stream(server, client) -> None:
    server.script([Reply.text("one two three four", chunk_delay=0.05)])
    started = time.monotonic()
    chunks = await stream_chunks(client)
    assert time.monotonic() - started >= 0.05 * (len(chunks) - 1)


async def test_a_stream_cut_mid_answer_raises_a_connection_error(server, client) -> None:
    server.script([Reply.text("one two three four", disconnect_after=3)])
    stream = await client.chat.completions.create(model="m", messages=HELLO, stream=True)
    received: list[str] = []

    async def read_all() -> None:
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")

    with pytest.raises(openai.APIConnectionError):
        await read_all()
    assert "".join(received) == "one two"


async def test_models_lists_the_scripted_model_names() -> None:
    async with ScriptedModelServer(models=["extra"], default=DemoModel()) as server:
        server.script([Reply.text("x")], model="primary")
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="test") as sdk:
            listed = [m.id async for m in sdk.models.list()]
    assert listed == ["extra", "primary", DEMO_MODEL_NAME]


# --- the offline demo model ---------------------------------------------------------------


@pytest_asyncio.fixture
async def demo() -> AsyncIterator[openai.AsyncOpenAI]:
    async with (
        ScriptedModelServer(default=DemoModel()) as server,
        openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0) as sdk,
    ):
        yield sdk


async def test_the_demo_model_reads_a_file_then_summarises_the_result(demo) -> None:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Please read docs/README.md."},
    ]
    tools = [tool("file_read"), tool("file_search")]

    first = await demo.chat.completions.create(
        model=DEMO_MODEL_NAME, messages=messages, tools=tools
    )

    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    assert (message.content or "").startswith(LABEL)
    (call,) = message.tool_calls or []
    assert call.type == "function"
    assert call.function.name == "file_read"
    assert json.loads(call.function.arguments) == {"path": "docs/README.md"}

    messages.append(
        {
            "role": "assistant",
            "content": message.content,
            "tool_calls": [
                {"id": call.id, "type": "function", "function": call.function.model_dump()}
            ],
        }
    )
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "# Suzumio\nA plane."})
    stream = await demo.chat.completions.create(
        model=DEMO_MODEL_NAME, messages=messages, tools=tools, stream=True
    )
    summary = "".join([c.choices[0].delta.content or "" async for c in stream])

    assert summary.startswith(LABEL)
    assert "file_read" in summary
    assert "docs/README.md" in summary
    assert "# Suzumio\nA plane." in summary


@pytest.mark.parametrize(
    ("text", "name", "arguments"),
    [
        ("list files in src", "file_read", {"path": "src"}),
        ("List the files.", "file_read", {"path": "."}),
        ("search for 'a.b(c'", "file_search", {"pattern": r"a\.b\(c"}),
    ],
)
async def test_the_demo_model_lists_and_searches_files_with_tool_calls(
    demo, text, name, arguments
) -> None:
    completion = await demo.chat.completions.create(
        model=DEMO_MODEL_NAME,
        messages=[{"role": "user", "content": text}],
        tools=[tool("file_read"), tool("file_search")],
    )
    (call,) = completion.choices[0].message.tool_calls or []
    assert call.type == "function"
    assert (call.function.name, json.loads(call.function.arguments)) == (name, arguments)


@pytest.mark.parametrize(
    ("text", "tools", "expected"),
    [
        ("hello there", [], 'You said: "hello there"'),
        ("read me a story", [], 'You said: "read me a story"'),
        ("read notes.txt", [], "does not offer it"),
    ],
)
async def test_the_demo_model_answers_in_labelled_text_otherwise(
    demo, text, tools, expected
) -> None:
    answers = [
        await demo.chat.completions.create(
            model=DEMO_MODEL_NAME, messages=[{"role": "user", "content": text}], tools=tools
        )
        for _ in range(2)
    ]
    contents = [a.choices[0].message.content or "" for a in answers]
    assert contents[0] == contents[1]  # deterministic
    assert contents[0].startswith(LABEL)
    assert expected in contents[0]
    assert answers[0].choices[0].finish_reason == "stop"


# --- as a process -------------------------------------------------------------------------


async def test_the_server_runs_as_a_process_and_prints_its_url(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "scripted first"}]))
    process = subprocess.Popen(
        [sys.executable, "-m", "suzumio.testing.model_server", "--demo", "--script", str(script)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        url = (await asyncio.to_thread(process.stdout.readline)).strip()
        assert url.startswith("http://127.0.0.1:")
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as sdk:
            assert await ask(sdk) == "scripted first"
            assert (await ask(sdk, DEMO_MODEL_NAME) or "").startswith(LABEL)
    finally:
        process.terminate()
        assert await asyncio.to_thread(process.wait, 10) == 0


async def test_a_stream_ended_early_ends_cleanly_with_no_finish_and_no_done(
    server: ScriptedModelServer,
) -> None:
    server.script([Reply.text("one two three four", end_after=3)])
    request = {"model": "m", "messages": HELLO, "stream": True}
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{server.url}/v1/chat/completions", json=request)
    assert response.status_code == 200  # a whole HTTP response: no transport error
    events = [line for line in response.text.splitlines() if line.startswith("data: ")]
    assert len(events) == 3
    chunks = [json.loads(e.removeprefix("data: ")) for e in events]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "one two"
