"""One leader among a service's replicas: whoever holds a Postgres advisory lock.

The lock lives on a connection of its own, so a leader that dies (even by SIGKILL) releases
it the moment the server sees the connection close. A leader that cannot reach Postgres for
`heartbeat * 2` seconds steps down by itself. Leadership only makes normal operation tidy
(one replica decides); correctness where two could briefly overlap must come from conditional
appends, not from the lock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

import asyncpg

from suzumio.platform.db.pool import connect
from suzumio.platform.db.trouble import is_postgres_trouble
from suzumio.platform.logging import get_logger

log = get_logger(__name__)

Lead = Callable[[asyncio.Event], Coroutine[Any, Any, None]]
# How long a term's `lead` has to end once told, and then, cancelled, to finish its cleanup
# (each): the lock is held meanwhile, so no other replica leads beside the term's last acts.
LEAD_END_SECONDS = 10.0
_LOCK = "SELECT pg_try_advisory_lock(hashtext('suzumio.leader.' || $1))"


def _interrupted(exc: BaseException) -> bool:
    """Whether the lock's connection failed for Postgres's reasons: contend again, never end
    the service. Any error of the server counts (its two statements are fixed: a refusal is the
    server's state, such as too many connections, not a bug of the statement), and a late
    answer; asyncpg's client-side errors only in the shapes of a connection lost (a connection
    cut mid-statement fails so, before asyncpg sees it closed: see `is_postgres_trouble`)."""
    return isinstance(exc, OSError | asyncpg.PostgresError) or is_postgres_trouble(exc)


class Leadership:
    def __init__(
        self, dsn: str, name: str, *, retry_seconds: float = 0.5, heartbeat_seconds: float = 1.0
    ) -> None:
        self._dsn = dsn
        self.name = name
        self._retry = retry_seconds
        self._heartbeat = heartbeat_seconds
        self.leading = False

    async def run(self, stop: asyncio.Event, lead: Lead) -> None:
        """Contend until `stop`; while leading, run `lead(done)`, which must return soon after
        `done` is set (leadership lost, or stopping)."""
        while not stop.is_set():
            try:
                await self._term(stop, lead)
            except Exception as exc:
                if not _interrupted(exc):
                    raise
                log.warning("leadership.interrupted", name=self.name, error=repr(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._retry)

    async def _term(self, stop: asyncio.Event, lead: Lead) -> None:
        conn = await asyncio.wait_for(connect(self._dsn, f"suzumio-leader-{self.name}"), 10)
        try:
            while not await asyncio.wait_for(conn.fetchval(_LOCK, self.name), self._heartbeat * 2):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self._retry)
                if stop.is_set():
                    return
            self.leading = True
            log.info("leadership.gained", name=self.name)
            done = asyncio.Event()
            task = asyncio.create_task(lead(done))
            try:
                await self._hold(conn, stop, task)
            finally:
                self.leading = False
                done.set()
                _, unfinished = await asyncio.wait({task}, timeout=LEAD_END_SECONDS)
                for late in unfinished:
                    late.cancel()
                if unfinished:
                    # Its cleanup is under way (its `finally`): another replica taking the
                    # lock now would lead beside it, its state cleared under the new term.
                    await asyncio.wait(unfinished, timeout=LEAD_END_SECONDS)
                log.info("leadership.ended", name=self.name)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 2)

    async def _hold(
        self, conn: asyncpg.Connection, stop: asyncio.Event, task: asyncio.Task[None]
    ) -> None:
        """Return when stopping, when `lead` ended, or when the lock's connection fails."""
        stopping = asyncio.create_task(stop.wait())
        try:
            while True:
                ended, _ = await asyncio.wait(
                    {stopping, task}, timeout=self._heartbeat, return_when=asyncio.FIRST_COMPLETED
                )
                if ended:
                    break
                await asyncio.wait_for(conn.fetchval("SELECT 1"), self._heartbeat * 2)
        finally:
            stopping.cancel()
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.error("leadership.lead_failed", name=self.name, error=repr(task.exception()))
