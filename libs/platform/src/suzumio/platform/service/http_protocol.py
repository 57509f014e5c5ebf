"""uvicorn's httptools protocol with a bound on a request's head (and a chunked body's trailers).

httptools parses a request in C, where h11 does it in Python: on the runner's calls to the
tool-broker (several per activation, each small) that is ~0.2 ms of the broker's CPU a call.
But uvicorn bounds a request's head only on h11 (`h11_max_incomplete_event_size`, 16 KiB by
default, of a head not yet whole in its buffer): on httptools a stranger's headers may be any
size, every one of them held in memory until the head ends.

Here two counts bound a head, and a chunked body's trailers (which httptools parses as headers,
gathering an unfinished one across reads): the request line and header fields as they are
parsed, and the bytes of reads that carry no body (a read that ends a head or a message, or
brings body bytes, starts that count again — give or take that one read). Past `MAX_HEAD_BYTES`
the request is answered `431 Request Header Fields Too Large` and the connection closed: a head
before any of it reaches the application, a header or trailer that never ends included. The
bound is on every head, whole in one read or not (h11's held only for a head still incomplete).
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEAD_BYTES = 16 * 1024
# Each header line's `: ` and CRLF, as h11 counts the bytes it buffers.
_LINE_OVERHEAD = 4


class HeadTooLargeError(Exception):
    """Raised in a parser callback to stop the parse (httptools wraps it as a parser error,
    which uvicorn answers through `send_400_response`)."""


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0  # the head (or the trailers) as parsed
        self._unparsed = 0  # the bytes of reads in a row that carried no body and ended nothing
        self._head_too_large = False
        self._moved = False  # this read ended a head or a message, or brought body bytes

    def data_received(self, data: bytes) -> None:
        self._moved = False
        super().data_received(data)
        if self._moved:
            self._unparsed = 0
        elif not self._head_too_large:
            self._unparsed += len(data)
            if self._unparsed > MAX_HEAD_BYTES and not self.transport.is_closing():
                self._head_too_large = True
                self.send_400_response("")

    def on_message_begin(self) -> None:
        self._head_bytes = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + _LINE_OVERHEAD)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._moved = True
        self._head_bytes = 0  # trailers, if any, have a bound of their own
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._moved = True
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._moved = True
        super().on_message_complete()

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            self._head_too_large = True
            raise HeadTooLargeError

    def send_400_response(self, msg: str) -> None:
        if not self._head_too_large:
            super().send_400_response(msg)
            return
        self.logger.warning("Request head or trailers over %d bytes: answered 431", MAX_HEAD_BYTES)
        body = b"request head too large"
        content = [b"HTTP/1.1 431 Request Header Fields Too Large\r\n"]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend(
            [
                b"content-type: text/plain; charset=utf-8\r\n",
                b"content-length: " + str(len(body)).encode() + b"\r\n",
                b"connection: close\r\n\r\n",
                body,
            ]
        )
        self.transport.write(b"".join(content))
        self.transport.close()
