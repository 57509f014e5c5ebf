"""Answers asked of the log while a read model is frozen (rebuilt for a new version, left to a
later release, or held at an event of a newer schema): its tables no longer follow the log,
so who may do what is asked of the service that owns the aggregate instead.

One question at a time per key (the requests that come meanwhile wait for its answer), each
answer kept as long as the read model's would be; none is kept that began before its key was
forgotten (a revocation through this gateway), else a check begun just before it kept what
was revoked working for the whole of that time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

MAX_KEPT = 50_000


class LogChecks(Generic[K, V]):
    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._kept: dict[K, tuple[V, float]] = {}  # key → answer, when it came
        self._flights: dict[K, asyncio.Future[V]] = {}
        self._generations: dict[K, int] = {}  # key → how often forgotten
        self._epoch = 0  # how often `_generations` was cleared

    async def get(self, key: K, ask: Callable[[], Awaitable[V]], *, refresh: bool = False) -> V:
        """The answer for `key`: kept, or asked (`refresh`: not a kept one, though one asked
        already joins — it began at most one question's time ago)."""
        kept = self._kept.get(key)
        if not refresh and kept is not None and time.monotonic() - kept[1] <= self._seconds:
            return kept[0]
        flight = self._flights.get(key)
        if flight is None:
            flight = asyncio.ensure_future(self._ask(key, ask, self._generation(key)))
            self._flights[key] = flight
            flight.add_done_callback(lambda done: self._landed(key, done))
        return await asyncio.shield(flight)

    def forget(self, key: K) -> None:
        self._kept.pop(key, None)
        self._flights.pop(key, None)  # the next request asks afresh
        self._generations[key] = self._generations.get(key, 0) + 1
        if len(self._generations) > MAX_KEPT:
            # A new epoch: no question in flight (asked in the last one) is kept.
            self._generations.clear()
            self._epoch += 1

    def _generation(self, key: K) -> tuple[int, int]:
        return self._epoch, self._generations.get(key, 0)

    async def _ask(self, key: K, ask: Callable[[], Awaitable[V]], generation: tuple[int, int]) -> V:
        answer = await ask()
        if self._generation(key) == generation:  # not forgotten since it was asked
            self._kept[key] = (answer, time.monotonic())
            if len(self._kept) > MAX_KEPT:
                self._kept.clear()
        return answer

    def _landed(self, key: K, flight: asyncio.Future[V]) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
        if not flight.cancelled():
            flight.exception()  # retrieved: each waiter has it raised already
