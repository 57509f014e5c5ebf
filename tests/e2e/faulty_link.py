"""A loopback TCP relay in front of the real gateway that breaks chosen connections the way
networks do: an answer lost on its way back (the request did reach the gateway), a
connection that goes silent without ever being closed (a NAT's state dropped, a host gone),
or a proxy's 503 for a gateway it cannot reach (the request goes nowhere).
Every other connection is relayed as it is. It fakes no service: what answers is the gateway.

A connection is picked by its first request's line (`POST /v1/sessions/.../messages`), at
most `times` of them per fault."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

Fault = Literal["lose_answer", "go_silent", "proxy_503"]
HEAD_END = b"\r\n\r\n"


@dataclass
class Rule:
    fault: Fault
    request_line_prefix: bytes  # e.g. b"POST /v1/sessions/"
    request_line_suffix: bytes = b""  # before " HTTP/1.1", e.g. b"/messages"
    times: int = 1
    hits: int = 0

    def matches(self, line: bytes) -> bool:
        target = line.rsplit(b" ", 1)[0].split(b"?", 1)[0]
        return (
            self.hits < self.times
            and target.startswith(self.request_line_prefix)
            and target.endswith(self.request_line_suffix)
        )


@dataclass
class FaultyLink:
    upstream: str  # http://127.0.0.1:port
    rules: list[Rule] = field(default_factory=list)
    url: str = ""
    _held: list[asyncio.StreamWriter] = field(default_factory=list)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        parts = urlsplit(self.upstream)
        try:
            up_reader, up_writer = await asyncio.open_connection(parts.hostname, parts.port)
        except OSError:
            writer.close()
            return
        try:
            head = await reader.readuntil(HEAD_END)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            up_writer.close()
            return
        line = head.split(b"\r\n", 1)[0]
        rule = next((r for r in self.rules if r.matches(line)), None)
        if rule is not None:
            rule.hits += 1
        if rule is None or rule.fault != "proxy_503":
            up_writer.write(head)
        try:
            if rule is None:
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            elif rule.fault == "proxy_503":
                up_writer.close()
                writer.write(
                    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/html\r\n"
                    b"content-length: 20\r\nconnection: close\r\n\r\n<h1>no gateway</h1>\n"
                )
                await writer.drain()
                writer.close()
            elif rule.fault == "lose_answer":
                # The request goes through whole; the answer is read and thrown away, then
                # the client's connection closed: it never learns what the gateway did.
                sending = asyncio.create_task(_pipe(reader, up_writer))
                with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                    await up_reader.readuntil(HEAD_END)
                sending.cancel()
                writer.close()
                up_writer.close()
            else:  # go_silent: the answer's head reaches the client, then nothing ever does
                sending = asyncio.create_task(_pipe(reader, up_writer))
                with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                    writer.write(await up_reader.readuntil(HEAD_END))
                    await writer.drain()
                self._held += [writer, up_writer]
                await asyncio.Event().wait()  # held open until the link closes
        finally:
            self._tasks.discard(task)

    @classmethod
    @contextlib.asynccontextmanager
    async def running(cls, upstream: str, *rules: Rule) -> AsyncIterator[FaultyLink]:
        link = cls(upstream, list(rules))
        server = await asyncio.start_server(link._serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        link.url = f"http://127.0.0.1:{port}"
        try:
            yield link
        finally:
            server.close()
            for task in list(link._tasks):
                task.cancel()
            for writer in link._held:
                writer.close()
            await asyncio.gather(*link._tasks, return_exceptions=True)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65_536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()
