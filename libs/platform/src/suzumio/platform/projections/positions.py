"""Read-your-writes: waiting until the read models reached a position of the log.

The projector notifies `suzumio_projections` on every commit; a `PositionWatcher` keeps each
projection's checkpoint and the lowest of them, and wakes whoever waits for a position at or
below one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from suzumio.platform.db import pool as db
from suzumio.platform.db.pool import Connection
from suzumio.platform.logging import get_logger
from suzumio.platform.position import Position

log = get_logger(__name__)
CHANNEL = "suzumio_projections"
POSITIONS = "SELECT name, position FROM suzumio.projection_checkpoints WHERE serving"


async def notify(conn: Connection, position: int) -> None:
    """Tell watchers (at commit) that read models moved; call inside the batch transaction."""
    await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, str(position))


class PositionWatcher:
    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._position = Position()
        self._named: dict[str, Position] = {}  # each serving projection's own
        self._serving: frozenset[str] | None = None  # the projections serving, last read
        self._read = asyncio.Event()  # set at the first read
        self._made = time.monotonic()
        self._conn: Connection | None = None
        self._query = asyncio.Lock()  # one query at a time on the listening connection
        self._dirty = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, stop: asyncio.Event) -> None:
        """Listen (reconnecting as needed) until `stop` is set."""
        while not stop.is_set():
            try:
                self._conn = await db.connect(self._dsn, "suzumio-positions")
                await self._conn.add_listener(CHANNEL, self._on_notify)
                await self._refresh()
                while not stop.is_set() and not self._conn.is_closed():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 5.0)
                    await self._refresh()  # also a safety net for a lost notification
            except Exception as exc:
                log.warning("positions.listener_failed", error=repr(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
            finally:
                if self._conn is not None:
                    with contextlib.suppress(Exception):
                        await self._conn.close()

    def _on_notify(self, *_: object) -> None:
        task = asyncio.get_running_loop().create_task(self._refresh())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _refresh(self) -> None:
        self._dirty = True
        if self._query.locked():
            return  # the refresh running now goes round once more
        async with self._query:
            while self._dirty:
                self._dirty = False
                if self._conn is None or self._conn.is_closed():
                    return
                rows = await self._conn.fetch(POSITIONS)
                self._serving = frozenset(str(row["name"]) for row in rows)
                self._read.set()
                for row in rows:
                    named = self._named.setdefault(str(row["name"]), Position())
                    if int(row["position"]) != named.value:
                        await named.advance(int(row["position"]))
                position = min((int(row["position"]) for row in rows), default=0)
                if position != self._position.value:
                    await self._position.advance(position)

    @property
    def position(self) -> int:
        """The lowest position every serving read model reflects."""
        return self._position.value

    def position_of(self, projection: str) -> int:
        """The position the read model `projection` reflects (0: not known to be serving)."""
        named = self._named.get(projection)
        return named.value if named is not None else 0

    def serving(self, projection: str) -> bool:
        """Whether the read model `projection` was maintained when last read (False before
        the first read). One that is not (rebuilt for a new version, left to another release)
        has frozen tables: what they show may have changed since in the log."""
        return self._serving is not None and projection in self._serving

    async def first_read(self, timeout: float) -> bool:
        """Wait for the first read of the positions (a moment after start), until `timeout`
        seconds after this watcher was made at most — not each caller that long, when the
        read never comes; whether it was done."""
        left = self._made + timeout - time.monotonic()
        if self._serving is None and left > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._read.wait(), left)
        return self._serving is not None

    async def wait_for(self, position: int, timeout: float, projection: str | None = None) -> bool:
        """True once every read model (or `projection` alone) reflects `position`; False
        after `timeout` seconds."""
        if projection is None:
            return await self._position.reached(position, timeout)
        named = self._named.setdefault(projection, Position())
        return await named.reached(position, timeout)
