"""Request/reply for publish acknowledgements over one wildcard reply subscription.

`nc.request` mints a NUID, a task-wrapping timeout and a fresh future per call; on the append
hot path that costs more than the JetStream write itself. Here a reply token is a counter and
the timeout a timer handle.
"""

from __future__ import annotations

import asyncio
import itertools

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError


def _expire(future: asyncio.Future[Msg]) -> None:
    if not future.done():
        future.set_exception(NatsTimeoutError())


class AckRequester:
    def __init__(self, nc: NATS) -> None:
        self._nc = nc
        self._prefix = ""
        self._waiting: dict[str, asyncio.Future[Msg]] = {}
        self._tokens = itertools.count()
        self._started = asyncio.Lock()

    async def _start(self) -> None:
        async with self._started:
            if not self._prefix:
                prefix = self._nc.new_inbox() + "."
                await self._nc.subscribe(prefix + "*", cb=self._on_reply)
                self._prefix = prefix

    async def _on_reply(self, msg: Msg) -> None:
        future = self._waiting.pop(msg.subject[len(self._prefix) :], None)
        if future is not None and not future.done():
            future.set_result(msg)

    async def request(
        self, subject: str, payload: bytes, headers: dict[str, str], timeout: float
    ) -> Msg:
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
        if msg.headers and msg.headers.get("Status") == "503":
            raise NoRespondersError
        return msg
