"""One asyncio lock per key (an aggregate, a session), made as it is first wanted and dropped
once nobody holds it or waits for it: a service taking turns on many keys keeps a lock only
for the keys in use."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class Turns(Generic[K]):
    def __init__(self) -> None:
        self._locks: dict[K, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        """How many keys have a lock now (held, or waited for)."""
        return len(self._locks)

    @contextlib.asynccontextmanager
    async def take(self, key: K) -> AsyncIterator[None]:
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)
