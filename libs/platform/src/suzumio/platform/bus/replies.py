"""Requests (publishes awaiting their acknowledgement, Direct Gets, commands) over one
wildcard reply subscription per connection.

`nc.request` mints a NUID, a task-wrapping timeout and a fresh future per call, and a request
with several replies (a Direct Get batch) needed a subscription of its own, made and removed
on the server each time; on the hot paths of appends and loads that cost more than the
JetStream work itself. Here a reply token is a counter and a timeout a timer handle.
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from collections import deque
from collections.abc import AsyncGenerator, Mapping
from weakref import WeakKeyDictionary

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import MaxPayloadError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

_OF: WeakKeyDictionary[NATS, Replies] = WeakKeyDictionary()


def _expire(future: asyncio.Future[Msg]) -> None:
    if not future.done():
        future.set_exception(NatsTimeoutError())


class _Stream:
    """The replies of one request as they come, and who waits for the next."""

    __slots__ = ("msgs", "waiter")

    def __init__(self) -> None:
        self.msgs: deque[Msg] = deque()
        self.waiter: asyncio.Future[Msg] | None = None

    def put(self, msg: Msg) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(msg)
            self.waiter = None
        else:
            self.msgs.append(msg)


class Replies:
    def __init__(self, nc: NATS) -> None:
        # Not a strong reference: the connection keys this instance in a weak mapping, which a
        # reference back would keep alive for as long as the process.
        self._nc: NATS = weakref.proxy(nc)
        self._prefix = ""
        self._waiting: dict[str, asyncio.Future[Msg]] = {}
        self._streams: dict[str, _Stream] = {}
        self._tokens = itertools.count()
        self._started = asyncio.Lock()

    @classmethod
    def of(cls, nc: NATS) -> Replies:
        """The connection's one instance (so one reply subscription per connection)."""
        found = _OF.get(nc)
        if found is None:
            found = _OF[nc] = cls(nc)
        return found

    async def _start(self) -> None:
        async with self._started:
            if not self._prefix:
                prefix = self._nc.new_inbox() + "."
                await self._nc.subscribe(prefix + "*", cb=self._on_reply)
                self._prefix = prefix

    async def _on_reply(self, msg: Msg) -> None:
        token = msg.subject[len(self._prefix) :]
        future = self._waiting.pop(token, None)
        if future is not None:
            if not future.done():
                future.set_result(msg)
            return
        stream = self._streams.get(token)
        if stream is not None:
            stream.put(msg)

    async def request(
        self, subject: str, payload: bytes, headers: dict[str, str] | None, timeout: float
    ) -> Msg:
        """The one reply to a request.

        Raises:
            nats.errors.TimeoutError: none within `timeout`.
            nats.errors.NoRespondersError: nobody listens on `subject`.
            nats.errors.MaxPayloadError: the payload and headers together are larger than
                the server takes (nats-py checks the payload alone; the server answers a
                message over its limit by closing the connection, and everything in flight
                on it goes too).
        """
        if len(payload) + header_bytes(headers) > self._nc.max_payload:
            raise MaxPayloadError
        if not self._prefix:
            await self._start()
        loop = asyncio.get_running_loop()
        token = str(next(self._tokens))
        future: asyncio.Future[Msg] = loop.create_future()
        self._waiting[token] = future
        timer = loop.call_later(timeout, _expire, future)
        try:
            await self._nc.publish(subject, payload, reply=self._prefix + token, headers=headers)
            msg = await future
        finally:
            timer.cancel()
            self._waiting.pop(token, None)
        _raise_no_responders(msg)
        return msg

    async def replies(
        self, subject: str, payload: bytes, timeout: float
    ) -> AsyncGenerator[Msg, None]:
        """Every reply to a request, in order, each within `timeout` of the one before; the
        caller stops reading when it has what it asked for (later replies are dropped).

        Raises:
            nats.errors.TimeoutError: the next reply did not come within `timeout`.
            nats.errors.NoRespondersError: nobody listens on `subject`.
        """
        if not self._prefix:
            await self._start()
        loop = asyncio.get_running_loop()
        token = str(next(self._tokens))
        stream = self._streams[token] = _Stream()
        try:
            await self._nc.publish(subject, payload, reply=self._prefix + token)
            while True:
                if stream.msgs:
                    msg = stream.msgs.popleft()
                else:
                    stream.waiter = loop.create_future()
                    timer = loop.call_later(timeout, _expire, stream.waiter)
                    try:
                        msg = await stream.waiter
                    finally:
                        timer.cancel()
                        stream.waiter = None
                _raise_no_responders(msg)
                yield msg
        finally:
            self._streams.pop(token, None)


def header_bytes(headers: Mapping[str, str] | None) -> int:
    """The size of `headers` as nats-py sends them: what they take of the server's
    max_payload, which counts a message's headers and payload together."""
    if headers is None:  # an empty dict still sends the header block, as nats-py does
        return 0
    size = len(b"NATS/1.0\r\n\r\n")
    for key, value in headers.items():
        if key.strip():
            size += len(key.strip().encode()) + len(value.strip().encode()) + 4  # ": ", CRLF
    return size


def _raise_no_responders(msg: Msg) -> None:
    if msg.headers and msg.headers.get("Status") == "503":
        raise NoRespondersError
