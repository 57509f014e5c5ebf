"""A bound on request bodies, kept before the application reads them.

A framework that validates bodies (FastAPI) reads the whole body before any dependency runs —
before the caller is even authenticated — so without a bound anyone who can reach the port can
make a service hold as much as they send. `BodyLimit` answers 413 with a problem body as soon
as the declared `Content-Length` is over the bound, without reading a byte of it, or as soon
as a streamed body passes it; the application then sees the client gone and nothing it
answers is sent.

A client that writes its whole body before it reads the answer (httpx, the runner's own
uploads) must still get that answer. Were the connection closed with the body unread, the
kernel would reset it and drop the 413 on the way. So a declared body at most `DRAIN_BYTES`
over the bound is refused on a connection that stays open: the HTTP server reads the rest and
throws it away (reading, not holding: at most 64 MiB of a stranger's bytes, as a larger upload
route allows anyway). A larger one, or a streamed one of unknown length, is refused with
`Connection: close`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

PROBLEM_JSON = b"application/problem+json"
DRAIN_BYTES = 64 << 20  # what is read and thrown away past the bound so the 413 arrives


@dataclass(frozen=True)
class BodyLimits:
    """How large a request body may be: `default`, or the limit of the longest prefix in
    `paths` that the request's path starts with (larger or smaller than the default)."""

    default: int
    paths: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.default < 0 or any(v < 0 for v in self.paths.values()):
            raise ValueError("body limits are sizes in bytes, never negative")

    def for_path(self, path: str) -> int:
        matched, limit = -1, self.default
        for prefix, value in self.paths.items():
            if len(prefix) > matched and path.startswith(prefix):
                matched, limit = len(prefix), value
        return limit


class BodyLimit:
    """ASGI middleware: refuses HTTP request bodies over `limits` with 413."""

    def __init__(self, app: ASGIApp, limits: BodyLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limits.for_path(scope["path"])
        declared = content_length(scope)
        if declared is not None and declared > limit:
            await _too_large(send, limit, close=declared - limit > DRAIN_BYTES)
            return
        guard = _Guard(receive, send, limit)
        try:
            await self.app(scope, guard.receive, guard.send)
        except Exception:
            # What the application made of the client it was told is gone is not news.
            if not guard.refused:
                raise


class _Guard:
    """The application's `receive` and `send`, counting the body as it arrives."""

    def __init__(self, receive: Receive, send: Send, limit: int) -> None:
        self._receive = receive
        self._send = send
        self._limit = limit
        self._received = 0
        self._started = False
        self.refused = False

    async def receive(self) -> Message:
        if self.refused:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self._received += len(message.get("body", b""))
            if self._received > self._limit:
                self.refused = True
                if not self._started:
                    await _too_large(self._send, self._limit, close=True)
                return {"type": "http.disconnect"}
        return message

    async def send(self, message: Message) -> None:
        if self.refused:
            return  # the 413 was the answer
        if message["type"] == "http.response.start":
            self._started = True
        await self._send(message)


def content_length(scope: Scope) -> int | None:
    """The request's declared body length (None: not declared, or not a number)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            # A malformed value is the HTTP server's to refuse; it never reaches here as a body.
            return int(value) if value.isdigit() else None
    return None


async def send_problem(
    send: Send,
    status: int,
    title: str,
    code: str,
    detail: str,
    *,
    close: bool,
    headers: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    """An RFC 9457 problem answered at the ASGI level, before any application ran; `close`:
    with the rest of the body never read, the connection cannot carry another request."""
    body = json.dumps(
        {"type": "about:blank", "title": title, "status": status, "code": code, "detail": detail}
    ).encode()
    sent = [(b"content-type", PROBLEM_JSON), (b"content-length", str(len(body)).encode())]
    sent += headers
    if close:
        sent.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": sent})
    await send({"type": "http.response.body", "body": body})


async def _too_large(send: Send, limit: int, *, close: bool) -> None:
    detail = f"the request body is larger than {limit} bytes"
    await send_problem(send, 413, "Content Too Large", "too_large", detail, close=close)
