"""The runner's HTTP clients over real loopback sockets, both kinds: those a resident runner
keeps (on aiohttp, the `aiohttp` extra being installed here) and those a one-shot runner makes
(httpx's own transport). A connection that fails in any way is a transport failure the callers
know — the loop retries it, the broker client retries and then says the broker is unavailable —
never an aiohttp error they would take for a crash; a kept connection the server dropped is
recovered; a streamed upload arrives whole; kept model clients are shared per endpoint and key
only; without the extra, the kept clients are httpx's and work the same."""

from __future__ import annotations

import asyncio
import contextlib
import io
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import openai
import pytest
from httpx_aiohttp import AiohttpTransport

from suzumio.contracts.broker import HistoryEntryIn
from suzumio.contracts.runner import RunnerActivationOutput
from suzumio.contracts.values import ModelSpec
from suzumio.runner import connections as connections_module
from suzumio.runner.broker import BrokerClient, BrokerUnavailableError
from suzumio.runner.connections import Connections
from suzumio.runner.loop.failures import FailureClass, classify
from suzumio.runner.model import Endpoint, ModelClient
from suzumio.testing.model_server import NoopModelServer

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
HELLO = [{"role": "user", "content": "hello"}]


@contextlib.asynccontextmanager
async def _server(handler: Handler) -> AsyncIterator[str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2)


async def _request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request's head and body (Content-Length or chunked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    length = next((int(x.split(b":")[1]) for x in lines if x.startswith(b"content-length")), 0)
    if b"transfer-encoding: chunked" not in lines:
        return head, await reader.readexactly(length)
    body = b""
    while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
        body += await reader.readexactly(size)
        await reader.readexactly(2)
    await reader.readexactly(2)
    return head, body


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _json_response(body: bytes) -> bytes:
    head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}"
    return head.encode() + b"\r\n\r\n" + body


@contextlib.asynccontextmanager
async def _kept(kept: bool) -> AsyncIterator[Connections | None]:
    connections = Connections() if kept else None
    try:
        yield connections
    finally:
        if connections is not None:
            await connections.aclose()


async def _model_failure(url: str, kept: bool) -> FailureClass:
    async with _kept(kept) as connections:
        client = ModelClient(ModelSpec(name="m"), Endpoint(url, "k"), 5, kept=connections)
        try:
            with pytest.raises(Exception) as caught:
                await client.complete(HELLO, [], 100)
        finally:
            await client.close()
    return classify(caught.value).cls


def _broker(url: str, connections: Connections | None, **kw: Any) -> BrokerClient:
    http = connections.broker(url, 5) if connections is not None else None
    return BrokerClient(url, "token", timeout=5, http=http, **kw)


async def _unavailable(url: str, connections: Connections | None) -> None:
    """A call with one retry ends unavailable (the output's own tries are more: see
    test_runner_broker_unavailable.py)."""
    client = _broker(url, connections, retries=1, output_retries=1)
    try:
        with pytest.raises(BrokerUnavailableError):
            await client.append_history(
                [HistoryEntryIn(message_id="m" * 26, role="user", text="x")]
            )
    finally:
        await client.aclose()


KINDS = pytest.mark.parametrize("kept", [True, False], ids=["kept", "own"])


@KINDS
async def test_a_model_stream_cut_mid_way_is_a_transport_failure(kept: bool) -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 5000\r\n\r\n"
            b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'
        )
        await writer.drain()
        writer.transport.abort()

    async with _server(cut) as url:
        assert await _model_failure(f"{url}/v1", kept) is FailureClass.TRANSPORT


@KINDS
async def test_a_model_endpoint_nobody_listens_on_is_a_transport_failure(kept: bool) -> None:
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    assert await _model_failure(url, kept) is FailureClass.TRANSPORT


@KINDS
async def test_a_model_that_closes_without_answering_is_a_transport_failure(kept: bool) -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        writer.close()

    async with _server(hang_up) as url:
        assert await _model_failure(f"{url}/v1", kept) is FailureClass.TRANSPORT


async def test_kept_model_clients_are_shared_by_endpoint_and_key_only() -> None:
    kept = Connections()
    try:
        async with NoopModelServer() as model:
            url = f"{model.url}/v1"
            first = ModelClient(ModelSpec(name="m"), Endpoint(url, "key-a"), kept=kept)
            again = ModelClient(ModelSpec(name="other"), Endpoint(url, "key-a"), kept=kept)
            other_key = ModelClient(ModelSpec(name="m"), Endpoint(url, "key-b"), kept=kept)
            turns = [await c.complete(HELLO, [], 10) for c in (first, again, other_key)]
            for client in (first, again, other_key):
                await client.close()  # leaves the kept clients open
            assert (await first.complete(HELLO, [], 10)).text == "ok"
    finally:
        await kept.aclose()
    assert first._client is again._client
    assert other_key._client is not first._client
    assert other_key._client.api_key == "key-b"
    assert [t.text for t in turns] == ["ok"] * 3
    assert model.calls == 4


async def test_a_kept_broker_connection_the_server_dropped_is_recovered() -> None:
    """The server answers, then closes the connection without saying so (as an idle timeout
    does): the kept client's next request finds it dead, and goes again on a new one."""
    connections = 0

    async def answer_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await _request(reader)
        writer.write(_json_response(b'{"recorded": true}'))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()

    kept = Connections()
    try:
        async with _server(answer_once) as url:
            http = kept.broker(url, 5)
            for text in ("a", "b", "c"):
                client = BrokerClient(url, "token", retries=2, http=http)
                await client.output(RunnerActivationOutput(text=text))
                await client.aclose()
                await asyncio.sleep(0.2)  # the server has closed it by now
    finally:
        await kept.aclose()
    assert connections == 3


@KINDS
async def test_a_broker_nobody_listens_on_is_unavailable_not_a_crash(kept: bool) -> None:
    async with _kept(kept) as connections:
        await _unavailable(f"http://127.0.0.1:{_closed_port()}", connections)


@KINDS
async def test_a_broker_that_hangs_up_mid_answer_is_retried(kept: bool) -> None:
    tries = 0

    async def flaky(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal tries
        tries += 1
        await _request(reader)
        if tries == 1:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{")
            await writer.drain()
            writer.transport.abort()
            return
        writer.write(_json_response(b'{"recorded": true}'))
        await writer.drain()
        writer.close()

    async with _server(flaky) as url, _kept(kept) as connections:
        client = _broker(url, connections, retries=2)
        try:
            await client.output(RunnerActivationOutput(text="once"))
        finally:
            await client.aclose()
    assert tries == 2


@KINDS
async def test_a_streamed_upload_arrives_whole(kept: bool) -> None:
    received: list[bytes] = []

    async def store(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, body = await _request(reader)
        received.append(body)
        writer.write(_json_response(b'{"recorded": true}'))
        await writer.drain()
        writer.close()

    data = bytes(range(256)) * 4096  # 1 MiB, several chunks
    async with _server(store) as url, _kept(kept) as connections:
        client = _broker(url, connections, retries=0)
        try:
            assert await client.upload(0, "upload.bin", io.BytesIO(data), len(data))
        finally:
            await client.aclose()
    assert received == [data]


async def test_kept_clients_go_over_aiohttp_with_the_extra_and_httpx_without(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = 0

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal calls
        await _request(reader)
        calls += 1
        writer.write(_json_response(b'{"recorded": true}'))
        await writer.drain()
        writer.close()

    async with _server(answer) as url, NoopModelServer() as model:
        for extra in (True, False):
            monkeypatch.setattr(connections_module, "AIOHTTP", extra)
            kept = Connections()
            try:
                client = _broker(url, kept)
                await client.output(RunnerActivationOutput(text="kept"))
                sdk = ModelClient(ModelSpec(name="m"), Endpoint(f"{model.url}/v1", "k"), kept=kept)
                assert (await sdk.complete(HELLO, [], 10)).text == "ok"
                assert isinstance(kept.broker(url, 5)._transport, AiohttpTransport) is extra
                assert isinstance(kept.model(), openai.DefaultAioHttpClient) is extra
            finally:
                await kept.aclose()
    assert calls == 2
    assert model.calls == 2


@KINDS
async def test_a_broker_answer_that_is_not_http_is_unavailable_not_a_crash(kept: bool) -> None:
    """A proxy or balancer in between may answer anything: aiohttp's failures the transport
    leaves unmapped (a malformed answer) are transport errors too, retried, then
    `BrokerUnavailableError` — not an aiohttp error that would crash the runner."""
    tries = 0

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal tries
        tries += 1
        await _request(reader)
        writer.write(b"GARBAGE\r\n\r\n")
        await writer.drain()
        writer.close()

    async with _server(garbage) as url, _kept(kept) as connections:
        await _unavailable(url, connections)
    assert tries == 2


@KINDS
async def test_the_broker_is_reached_through_the_proxy_the_environment_names(
    kept: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines: list[bytes] = []

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head, _ = await _request(reader)
        lines.append(head.split(b"\r\n", 1)[0])
        writer.write(_json_response(b'{"recorded": true}'))
        await writer.drain()
        writer.close()

    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    async with _server(proxy) as proxy_url:
        monkeypatch.setenv("HTTP_PROXY", proxy_url)
        monkeypatch.setenv("http_proxy", proxy_url)
        async with _kept(kept) as connections:
            # Never resolved nor reached: the proxy answers for it.
            client = _broker("http://broker.invalid:8000", connections, retries=0)
            try:
                await client.output(RunnerActivationOutput(text="via the proxy"))
            finally:
                await client.aclose()
    assert lines == [b"POST http://broker.invalid:8000/activation-output HTTP/1.1"]
