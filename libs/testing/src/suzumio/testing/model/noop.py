"""A no-op model: every chat completion is answered at once with the same short text, for as
little CPU as an HTTP server can spend on it.

For throughput figures (`make bench`): the model runs on the same cores as the platform being
measured, and the scripted server's web stack (Starlette on uvicorn) spends ~0.7 ms of CPU on a
streamed answer — a cost of the model, not of the control plane, that a provider pays on its
own machines. This one speaks just enough HTTP/1.1 (keep-alive, `Content-Length` bodies) for
the `openai` SDK's clients and answers from bytes built once. Tests that check what a model was
asked, or script what it answers, use `ScriptedModelServer`.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from types import TracebackType
from typing import Self, cast

import orjson

from suzumio.testing.model.replies import Reply
from suzumio.testing.model.wire import Answer, completion_json, sse, stream_json

HEAD_LIMIT = 64 * 1024
BODY_LIMIT = 64 * 1024 * 1024


def _response(status: str, content_type: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _answers(text: str) -> tuple[bytes, bytes]:
    """The streamed answer and the whole one, as complete HTTP responses."""
    answer = Answer.build(Reply.text(text), {"model": "noop"}, 1, 0)
    streamed = b"".join(sse(chunk) for chunk in stream_json(answer, include_usage=True))
    return (
        _response("200 OK", "text/event-stream", streamed + sse("[DONE]")),
        _response("200 OK", "application/json", json.dumps(completion_json(answer)).encode()),
    )


BAD_REQUEST = _response(
    "400 Bad Request",
    "application/json",
    b'{"error":{"message":"not a chat completion request","type":"invalid_request_error"}}',
)


class NoopModelServer:
    """`async with NoopModelServer() as model:` — `model.url` (no `/v1`), `model.calls`."""

    def __init__(self, text: str = "ok", *, tls: ssl.SSLContext | None = None) -> None:
        """`tls`: served over TLS with this server context (`model.url` is then https)."""
        self._streamed, self._whole = _answers(text)
        self._tls = tls
        self._server: asyncio.Server | None = None
        self._connections: dict[_Connection, asyncio.Transport] = {}
        self.url = ""
        self.port = 0
        self.calls = 0
        self.connections = 0  # accepted so far (over TLS: each one a handshake)

    async def __aenter__(self) -> Self:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), "127.0.0.1", 0, ssl=self._tls
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self.url = f"{'https' if self._tls else 'http'}://127.0.0.1:{self.port}"
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._server is not None:
            self._server.close()
            for transport in list(self._connections.values()):  # kept-alive: they hold it open
                transport.close()
            await self._server.wait_closed()

    def remember(self, connection: _Connection, transport: asyncio.Transport) -> None:
        self._connections[connection] = transport
        self.connections += 1

    def forget(self, connection: _Connection) -> None:
        self._connections.pop(connection, None)

    def answer(self, body: bytes) -> bytes:
        try:
            request = orjson.loads(body)  # a third of `json.loads`'s CPU: the body is mostly tools
        except ValueError:
            return BAD_REQUEST
        if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
            return BAD_REQUEST
        self.calls += 1
        return self._streamed if request.get("stream") is True else self._whole


class _Connection(asyncio.Protocol):
    """One client connection: requests one after the other, each answered as it completes."""

    def __init__(self, server: NoopModelServer) -> None:
        self._server = server
        self._buffer = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast("asyncio.Transport", transport)  # uvloop's are not subclasses
        self._server.remember(self, self._transport)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while self._transport is not None and self._one():
            pass

    def _one(self) -> bool:
        """Answer the first request in the buffer if it is all there; whether it was."""
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > HEAD_LIMIT:
                self._close(BAD_REQUEST)
            return False
        head = self._buffer[:end].decode("latin-1").lower().split("\r\n")
        length, close = _framing(head[1:])
        if length < 0 or length > BODY_LIMIT:
            self._close(BAD_REQUEST)
            return False
        if len(self._buffer) < end + 4 + length:
            return False
        body = self._buffer[end + 4 : end + 4 + length]
        self._buffer = self._buffer[end + 4 + length :]
        method, _, rest = head[0].partition(" ")
        path = rest.partition(" ")[0]
        if method != "post" or not path.endswith("/chat/completions"):
            reply = _response("404 Not Found", "application/json", b'{"error":{"message":"no"}}')
        else:
            reply = self._server.answer(body)
        assert self._transport is not None
        self._transport.write(reply)
        if close:
            self._close(None)
            return False
        return True

    def _close(self, last: bytes | None) -> None:
        if self._transport is not None:
            if last is not None:
                self._transport.write(last)
            self._transport.close()  # connection_lost follows
            self._transport = None

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: ARG002
        self._server.forget(self)
        self._transport = None


def _framing(headers: list[str]) -> tuple[int, bool]:
    """The body's length (-1: unreadable, or chunked — not what an SDK sends a model) and
    whether the client closes after this request."""
    length, close = 0, False
    for line in headers:
        name, _, value = line.partition(":")
        if name == "content-length":
            length = int(value) if value.strip().isdigit() else -1
        elif name == "connection":
            close = value.strip() == "close"
        elif name == "transfer-encoding":
            return -1, close
    return length, close
