"""The body limit every service can put in front of its app: a declared length over it is
refused before a byte is read, a streamed body as soon as it passes it, and the app's own
answer (it sees the client gone) never reaches the client. Plain ASGI calls, no server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Message

from suzumio.platform.service import BodyLimit, BodyLimits
from suzumio.platform.service.bodylimit import DRAIN_BYTES

LIMITS = BodyLimits(1_000, {"/small": 10, "/small/but/large": 5_000})


async def echo(request: Request) -> JSONResponse:
    body = await request.body()
    return JSONResponse({"size": len(body)})


APP = BodyLimit(Starlette(routes=[Route("/{path:path}", echo, methods=["POST"])]), LIMITS)


class Client:
    """One request: the body in `chunks`, counting what the app pulls of it."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.pulled = 0
        self.sent: list[Message] = []

    async def receive(self) -> Message:
        if self.pulled == len(self.chunks):
            raise AssertionError("read past the end of the body")
        self.pulled += 1
        more = self.pulled < len(self.chunks)
        return {"type": "http.request", "body": self.chunks[self.pulled - 1], "more_body": more}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    async def post(self, path: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        scope: dict[str, Any] = {
            "type": "http",
            "method": "POST",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "headers": headers or [],
        }
        await APP(scope, self.receive, self.send)

    @property
    def status(self) -> int:
        [start] = [m for m in self.sent if m["type"] == "http.response.start"]
        return int(start["status"])

    @property
    def closes(self) -> bool:
        """Whether the answer ends the connection (the rest of the body is not read)."""
        [start] = [m for m in self.sent if m["type"] == "http.response.start"]
        return (b"connection", b"close") in start["headers"]

    @property
    def body(self) -> Any:
        return json.loads(b"".join(m.get("body", b"") for m in self.sent if "body" in m))


async def test_a_declared_length_over_the_limit_is_refused_unread() -> None:
    client = Client([b"x" * 2_000])
    await client.post("/anything", [(b"content-length", b"2000")])
    assert client.pulled == 0
    assert client.status == 413
    assert client.body["code"] == "too_large"
    assert (b"content-type", b"application/problem+json") in client.sent[0]["headers"]


@pytest.mark.parametrize(
    ("declared", "closes"),
    [(1_001, False), (1_000 + DRAIN_BYTES, False), (1_001 + DRAIN_BYTES, True)],
)
async def test_a_body_a_little_over_is_refused_on_a_connection_that_stays(
    declared: int, closes: bool
) -> None:
    # Within DRAIN_BYTES of the limit the server reads the rest and drops it, so a client
    # that writes its whole body first still reads the 413; beyond, the connection ends.
    client = Client([b"x"])
    await client.post("/anything", [(b"content-length", str(declared).encode())])
    assert client.pulled == 0
    assert client.status == 413
    assert client.closes is closes


async def test_a_streamed_body_is_refused_as_it_passes_the_limit() -> None:
    client = Client([b"x" * 400] * 10)  # 4 000 bytes, no length declared
    await client.post("/anything")
    assert client.pulled == 3  # 1 200 bytes: past the 1 000 allowed, and no further
    assert client.status == 413
    assert client.closes  # a streamed body's length is not known: nothing more is read
    assert len([m for m in client.sent if m["type"] == "http.response.start"]) == 1


@pytest.mark.parametrize(
    ("path", "size", "status"),
    [
        ("/anything", 1_000, 200),
        ("/small", 11, 413),
        ("/small/x", 10, 200),
        ("/small/but/large/x", 4_000, 200),  # the longest prefix decides
    ],
)
async def test_each_path_has_the_limit_of_its_longest_prefix(
    path: str, size: int, status: int
) -> None:
    client = Client([b"x" * size])
    await client.post(path)
    assert client.status == status
    if status == 200:
        assert client.body == {"size": size}
