"""uvicorn's httptools protocol with a bound on a request's head.

httptools parses a request in C, where h11 does it in Python: on the runner's calls to the
tool-broker (several per activation, each small) that is ~0.2 ms of the broker's CPU a call.
But uvicorn bounds a request's head only on h11 (`h11_max_incomplete_event_size`, 16 KiB by
default): on httptools a stranger's headers may be any size, every one of them held in memory
until the head ends. Here the request line and the headers count as they are parsed, and a
head past `MAX_HEAD_BYTES` is answered `431 Request Header Fields Too Large` and the
connection closed, before any of it reaches the application. httptools also gathers a header
that has not ended yet across reads, so the bytes read while a head is open count too: a
header that never ends is cut off as well (give or take the one read that ended the last
head).
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEAD_BYTES = 16 * 1024  # h11's default, which the services had before
# Each header line's `: ` and CRLF, as h11 counts the bytes it buffers.
_LINE_OVERHEAD = 4


class HeadTooLargeError(Exception):
    """Raised in a parser callback to stop the parse (httptools wraps it as a parser error,
    which uvicorn answers through `send_400_response`)."""


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0  # the head as parsed: its request line and headers
        self._head_read = 0  # the bytes read while a head was open
        self._head_too_large = False
        self._in_body = False  # between a head's end and its message's end
        self._ends = 0  # heads and messages ended

    def data_received(self, data: bytes) -> None:
        ends = self._ends
        super().data_received(data)
        if self._ends != ends:
            # The read ended a head or a message: what came after it is a body, or the start
            # of the next head (uncounted: at most this one read).
            self._head_read = 0
        elif not self._in_body and not self._head_too_large:
            self._head_read += len(data)
            if self._head_read > MAX_HEAD_BYTES and not self.transport.is_closing():
                self._head_too_large = True
                self.send_400_response("")

    def on_headers_complete(self) -> None:
        self._in_body = True
        self._ends += 1
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_body = False
        self._ends += 1
        super().on_message_complete()

    def on_message_begin(self) -> None:
        self._head_bytes = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + _LINE_OVERHEAD)
        super().on_header(name, value)

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            self._head_too_large = True
            raise HeadTooLargeError

    def send_400_response(self, msg: str) -> None:
        if not self._head_too_large:
            super().send_400_response(msg)
            return
        body = b"request head too large"
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            b"content-type: text/plain; charset=utf-8\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n"
            b"connection: close\r\n\r\n" + body
        )
        self.transport.close()
