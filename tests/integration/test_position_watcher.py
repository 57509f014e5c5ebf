"""Read-your-writes waits on real Postgres: the watcher keeps each serving read model's
checkpoint besides the lowest of them, so the gateway waits for the keys' own read model
before it refuses a key it does not know, not for the slowest read model of all (a stuck one
held every wrong key's 401 for the whole read-your-writes timeout)."""

from __future__ import annotations

import asyncio

from suzumio.platform.db.pool import Pool
from suzumio.platform.projections.positions import CHANNEL, PositionWatcher
from tests.support import eventually


async def test_one_read_model_is_waited_for_apart_from_the_slowest(
    pool: Pool, database_url: str
) -> None:
    for name, position in (("users", 5), ("slow", 1)):
        await pool.execute(
            "INSERT INTO suzumio.projection_checkpoints (name, position, version, schema_name,"
            " serving) VALUES ($1, $2, 1, $3, true)",
            name,
            position,
            f"proj_{name}",
        )
    watcher = PositionWatcher(database_url)
    stop = asyncio.Event()
    running = asyncio.create_task(watcher.run(stop))
    try:
        await eventually(lambda: asyncio.sleep(0, watcher.position_of("users")), lambda p: p == 5)
        assert watcher.position == 1  # the lowest of all
        assert await watcher.wait_for(5, 0.1, projection="users")
        assert not await watcher.wait_for(5, 0.1)  # all of them: the slow one is not there
        assert watcher.position_of("unknown") == 0

        waiting = asyncio.create_task(watcher.wait_for(7, 10, projection="users"))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "UPDATE suzumio.projection_checkpoints SET position = 7 WHERE name = 'users'"
            )
            await conn.execute("SELECT pg_notify($1, '7')", CHANNEL)  # as the projector does
        assert await asyncio.wait_for(waiting, 10)
        assert watcher.position == 1
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)
