"""The shared "folded up to where?" mechanism: waiters wake when the position reaches theirs,
not before, and give up after their timeout."""

from __future__ import annotations

import asyncio

from suzumio.platform.position import Position


async def test_waiters_wake_when_their_position_is_reached() -> None:
    position = Position()
    early = asyncio.create_task(position.reached(5, timeout=5))
    late = asyncio.create_task(position.reached(9, timeout=5))
    await asyncio.sleep(0)
    await position.advance(4)
    await asyncio.sleep(0)
    assert not early.done()
    await position.advance(6)
    assert await early is True
    await asyncio.sleep(0)
    assert not late.done()
    await position.advance(9)
    assert await late is True
    assert await position.reached(3, timeout=0) is True  # behind us already: no wait


async def test_a_waiter_gives_up_after_its_timeout() -> None:
    position = Position()
    await position.advance(2)
    assert await position.reached(3, timeout=0.05) is False
    assert position.value == 2
