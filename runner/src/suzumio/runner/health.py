"""A pool worker's health endpoint (`--health-port`): plain HTTP on asyncio's own streams.

`GET /healthz` answers 200 while the worker runs and is not stopping — and, served by the
worker's own event loop, it is not answered at all while that loop is blocked, which is what
a liveness probe should see. `GET /readyz` answers 200 only while the worker can take work
(its `readiness()` says why not: a one-line JSON reason with 503). Anything else is 404.

The runner depends on `suzumio.contracts` alone, hence no web framework: one request per
connection, its request line and headers read within `READ_TIMEOUT_SECONDS` and `MAX_LINE`
bytes a line, at most `MAX_HEADERS` lines and `MAX_CONNECTIONS` clients at once — a client
that sends an endless line, trickles bytes or opens many connections is cut off, and costs the
worker's activations nothing but a few reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Protocol

HEALTHZ = "/healthz"
READYZ = "/readyz"
ROUTES = (HEALTHZ, READYZ)
MAX_LINE = 8 * 1024  # a request line or a header line; kubelet's are far shorter
MAX_HEADERS = 64
MAX_CONNECTIONS = 16
READ_TIMEOUT_SECONDS = 5.0
WRITE_TIMEOUT_SECONDS = 5.0

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


class Probed(Protocol):
    """What the endpoint asks: None if all is well, else why not (one short line)."""

    def liveness(self) -> str | None: ...

    def readiness(self) -> str | None: ...


class HealthEndpointError(Exception):
    """The endpoint's address cannot be bound (taken, or not this host's)."""


class _RefusedError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class HealthServer:
    def __init__(self, probed: Probed) -> None:
        self._probed = probed
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self, host: str, port: int) -> None:
        """Listen on (host, port); port 0 picks a free one (`port` says which).

        Raises:
            HealthEndpointError: the address cannot be bound.
        """
        try:
            self._server = await asyncio.start_server(self._accept, host, port, limit=MAX_LINE)
        except OSError as exc:
            raise HealthEndpointError(f"cannot serve health on {host}:{port}: {exc}") from exc

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._clients):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2.0)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is None or len(self._clients) >= MAX_CONNECTIONS:
            writer.close()  # a flood of clients: the extra ones get nothing
            return
        self._clients.add(task)
        try:
            await self._serve(reader, writer)
        except (OSError, TimeoutError, asyncio.CancelledError):
            pass  # the client went or does not read, or the worker stops
        finally:
            self._clients.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        method = ""
        try:
            async with asyncio.timeout(READ_TIMEOUT_SECONDS):
                method, path = await _read_request(reader)
            status, body = self._answer(method, path)
        except _RefusedError as refused:
            status, body = refused.status, {"status": "refused"}
        except TimeoutError:
            status, body = 408, {"status": "refused"}
        await _respond(writer, status, body, with_body=method != "HEAD")

    def _answer(self, method: str, path: str) -> tuple[int, dict[str, str]]:
        if path not in ROUTES:
            return 404, {"status": "not found"}
        if method not in {"GET", "HEAD"}:
            return 405, {"status": "method not allowed"}
        why_not = self._probed.liveness() if path == HEALTHZ else self._probed.readiness()
        if why_not is None:
            return 200, {"status": "ok"}
        return 503, {"status": "unavailable", "reason": why_not}


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str]:
    """The method and path (less its query) of the request; its headers read and dropped.

    Raises:
        _RefusedError: a line too long, too many headers, or no request line.
    """
    parts = (await _line(reader)).split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise _RefusedError(400)
    for _ in range(MAX_HEADERS):
        if not await _line(reader):  # the blank line ending the headers
            return parts[0], parts[1].split("?", 1)[0]
    raise _RefusedError(431)


async def _line(reader: asyncio.StreamReader) -> str:
    try:
        raw = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError as exc:
        raise _RefusedError(431) from exc
    except asyncio.IncompleteReadError as exc:  # closed before the request was whole
        raise _RefusedError(400) from exc
    return raw.decode("latin-1").strip()


async def _respond(
    writer: asyncio.StreamWriter, status: int, body: dict[str, str], *, with_body: bool
) -> None:
    payload = (json.dumps(body) + "\n").encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n"
        "Cache-Control: no-store\r\n"
        "Connection: close\r\n\r\n"
    )
    writer.write(head.encode() + (payload if with_body else b""))
    async with asyncio.timeout(WRITE_TIMEOUT_SECONDS):  # a client that does not read
        await writer.drain()
