"""The no-op model of the throughput figures, driven through the real `openai` SDK (a fake
provider, like the scripted server: DESIGN.md §13)."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from suzumio.contracts.values import ModelSpec
from suzumio.runner.connections import Connections
from suzumio.runner.model import Endpoint, ModelClient
from suzumio.testing.model_server import NoopModelServer


async def test_the_sdk_reads_its_streamed_and_whole_answers() -> None:
    async with NoopModelServer(text="done") as model:
        sdk = openai.AsyncOpenAI(base_url=f"{model.url}/v1", api_key="k", max_retries=0)
        try:
            stream = await sdk.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
            whole = await sdk.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
        finally:
            await sdk.close()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "done"
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.completion_tokens >= 1
    assert whole.choices[0].message.content == "done"
    assert whole.choices[0].finish_reason == "stop"
    assert model.calls == 2


async def test_the_runners_model_client_gets_a_whole_turn_over_one_kept_connection() -> None:
    async with NoopModelServer() as model:
        kept = Connections()
        client = ModelClient(ModelSpec(name="m"), Endpoint(f"{model.url}/v1", "k"), kept=kept)
        try:
            turns = [
                await client.complete([{"role": "user", "content": "hi"}], [], 100)
                for _ in range(3)
            ]
            connections = len(model._connections)
        finally:
            await kept.aclose()
    assert [(t.text, t.finish_reason, t.tool_calls) for t in turns] == [("ok", "stop", [])] * 3
    assert model.calls == 3
    assert connections == 1


async def test_requests_split_across_writes_and_pipelined_are_each_answered() -> None:
    body = b'{"model":"m","messages":[],"stream":true}'
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    async with NoopModelServer() as model:
        port = int(model.url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request[:20])
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(request[20:] + request)  # the rest of one, then a second whole one
        await writer.drain()
        answers = []
        for _ in range(2):
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            answers.append((head.split(b"\r\n")[0], await reader.readexactly(length)))
        writer.close()
    assert [status for status, _ in answers] == [b"HTTP/1.1 200 OK"] * 2
    assert answers[0][1].endswith(b"data: [DONE]\n\n")
    assert model.calls == 2


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/chat/completions", b"not json", 400),
        ("/v1/chat/completions", b'{"model":"m"}', 400),
        ("/v1/embeddings", b'{"model":"m","messages":[]}', 404),
    ],
)
async def test_what_is_not_a_chat_completion_is_refused(
    path: str, body: bytes, status: int
) -> None:
    async with NoopModelServer() as model, httpx.AsyncClient() as http:
        response = await http.post(model.url + path, content=body)
    assert response.status_code == status
    assert model.calls == 0


async def test_it_closes_with_clients_still_connected() -> None:
    model = NoopModelServer()
    async with model:
        port = int(model.url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await asyncio.wait_for(reader.read(), 5) == b""  # the server hung up
    writer.close()


def test_it_serves_on_uvloop_as_the_bench_runs_it() -> None:
    import uvloop  # noqa: PLC0415 - the bench's loop

    async def ask() -> str | None:
        async with NoopModelServer() as model:
            sdk = openai.AsyncOpenAI(
                base_url=f"{model.url}/v1", api_key="k", max_retries=0, timeout=10
            )
            try:
                whole = await sdk.chat.completions.create(model="m", messages=[])
            finally:
                await sdk.close()
        return whole.choices[0].message.content

    assert uvloop.run(ask()) == "ok"
