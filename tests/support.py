"""Small helpers shared by tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T]],
    until: Callable[[T], bool],
    *,
    timeout: float = 10.0,
    what: str = "condition",
) -> T:
    """Poll `probe` until `until(result)` holds; fail with the last result after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        result = await probe()
        if until(result):
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last value: {result!r}")
        await asyncio.sleep(0.02)
