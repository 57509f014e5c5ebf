"""Expiring pending actions on time, without a polling loop that burns CPU: the task sleeps
until the earliest deadline it knows of (from the read model, or from a pending action this
process just created), expires what is due through the normal command path, and repeats."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from suzumio.contracts.commands import (
    CommandAccepted,
    CommandRejected,
    CommandRequest,
    ExpirePendingAction,
)
from suzumio.platform.db.pool import Pool
from suzumio.platform.logging import get_logger

log = get_logger(__name__)
MAX_SLEEP = timedelta(seconds=60)
# A deadline this process was told of may pass before the read model shows its row: it is
# looked for again every RECHECK until the row shows, for VISIBLE_WITHIN at most.
VISIBLE_WITHIN = timedelta(seconds=10)
RECHECK = timedelta(seconds=0.5)
RETRY_FAILED_AFTER = timedelta(seconds=60)
WATCH_HORIZON = 2 * MAX_SLEEP
TABLE = "proj_pending_actions.pending_actions"
PAGE = 500


class Dispatcher(Protocol):
    async def dispatch(self, request: CommandRequest) -> CommandAccepted | CommandRejected: ...


class ExpiryClock:
    def __init__(self, pool: Pool, router: Dispatcher, clock: Callable[[], datetime]) -> None:
        self._pool = pool
        self._router = router
        self._clock = clock
        # Deadlines of pending actions this process created, until their rows show in the
        # read model (which then answers for them) or VISIBLE_WITHIN after they passed.
        self._watch: dict[str, datetime] = {}
        self._wake = asyncio.Event()
        self._failed: dict[str, datetime] = {}  # id -> not to be retried before

    def notify(self, pending_action_id: str, deadline: datetime) -> None:
        """A pending action was created that expires at `deadline`. Watched only when it is
        due soon: the read model shows a later one's row long before it is due, and each pass
        (a minute apart at most) reads the next deadline there. Watching them all held every
        action created for as long as its timeout (up to 30 days), and scanned them all at
        each create."""
        if deadline - self._clock() > WATCH_HORIZON:
            return
        earliest = min(self._watch.values(), default=None)
        self._watch[pending_action_id] = deadline
        if earliest is None or deadline < earliest:
            self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                next_at = await self._expire_due(stop)
            except Exception:
                log.exception("expiry.failed")
                next_at = self._clock() + timedelta(seconds=5)
            seconds = self._sleep(next_at)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_first(stop, self._wake), seconds)

    def _sleep(self, next_at: datetime | None) -> float:
        """How long to sleep after a pass, `next_at` the read model's next deadline."""
        now = self._clock()
        # One whose row never showed that long after its deadline: answered before it, say.
        self._watch = {k: t for k, t in self._watch.items() if now - t <= VISIBLE_WITHIN}
        wake = [t for t in (next_at, *self._watch.values()) if t is not None]
        if any(t <= now for t in self._watch.values()):
            wake.append(now + RECHECK)  # due, its row not shown yet: look again in a moment
        sleep = min(wake, default=now + MAX_SLEEP) - now
        return min(max(sleep.total_seconds(), 0.05), MAX_SLEEP.total_seconds())

    async def _expire_due(self, stop: asyncio.Event | None = None) -> datetime | None:
        """Expire what is due; the next deadline after that."""
        if await self._pool.fetchval("SELECT to_regclass($1)", TABLE) is None:
            return None  # the projection is still being built
        now = self._clock()
        self._failed = {k: t for k, t in self._failed.items() if t > now}
        expired = 0
        after: tuple[datetime, str] | None = None
        while stop is None or not stop.is_set():
            # Oldest first, and past the ones that just failed, so one action that cannot be
            # expired never starves those behind it. Page after page (by key, as the rows
            # just expired may still read `open` while the projection catches up): what is
            # due past the first page must not wait for the next deadline, or a minute.
            due = await self._pool.fetch(
                "SELECT id, expires_at FROM proj_pending_actions.pending_actions"
                " WHERE status = 'open' AND expires_at <= $1 AND NOT (id = ANY($2::text[]))"
                " AND ($3::timestamptz IS NULL OR (expires_at, id) > ($3, $4))"
                " ORDER BY expires_at, id LIMIT $5",
                now,
                list(self._failed),
                after[0] if after else None,
                after[1] if after else "",
                PAGE,
            )
            expired += await self._expire(due, now)
            if len(due) < PAGE:
                break
            after = (due[-1]["expires_at"], due[-1]["id"])
        if expired:
            log.info("expiry.expired", count=expired)
        passed = [k for k, t in self._watch.items() if t <= now]
        if passed:  # the ones the read model shows (in any status) are its to answer for now
            shown = await self._pool.fetch(
                "SELECT id FROM proj_pending_actions.pending_actions WHERE id = ANY($1::text[])",
                passed,
            )
            for row in shown:
                self._watch.pop(row["id"], None)
        next_at: datetime | None = await self._pool.fetchval(
            "SELECT min(expires_at) FROM proj_pending_actions.pending_actions"
            " WHERE status = 'open' AND expires_at > $1",
            now,
        )
        return next_at

    async def _expire(self, due: Sequence[Any], now: datetime) -> int:
        """Expire these through the command path; how many it accepted."""
        expired = 0
        for row in due:
            request = CommandRequest(
                service="session",
                verb=ExpirePendingAction.verb,
                actor="system:session",
                data={"pending_action_id": row["id"]},
            )
            reply = await self._router.dispatch(request)
            if isinstance(reply, CommandRejected):
                error = reply.error.message
                log.warning("expiry.refused", pending_action_id=row["id"], error=error)
                self._failed[row["id"]] = now + RETRY_FAILED_AFTER
            else:
                expired += 1
        return expired


async def _first(*events: asyncio.Event) -> None:
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
