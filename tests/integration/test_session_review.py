"""Review of the session service's commands, expiry and reactions, against real NATS and
Postgres: what was found wrong, shown by the sequence that went wrong."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from suzumio.contracts.commands import CommandAccepted, CommandRejected, CommandRequest
from suzumio.platform.db.pool import Pool
from suzumio.session.expiry import PAGE, ExpiryClock

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


class StandInRouter:
    """Accepts every expiry and changes no row (as while the projection lags behind)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def dispatch(self, request: CommandRequest) -> CommandAccepted | CommandRejected:
        self.seen.append(str(request.data["pending_action_id"]))
        return CommandAccepted()


async def test_every_due_action_expires_in_one_pass_however_many_are_due(pool: Pool) -> None:
    """More than a page of actions due at once: before, the clock expired the first 500 and
    then slept until the next future deadline (up to a minute) before it took the next 500,
    so the rest expired late by a minute per page."""
    await pool.execute(
        "CREATE SCHEMA proj_pending_actions;"
        " CREATE TABLE proj_pending_actions.pending_actions"
        " (id text PRIMARY KEY, status text NOT NULL, expires_at timestamptz NOT NULL)"
    )
    due = [(f"due-{i:04}", "open", NOW - timedelta(seconds=1)) for i in range(PAGE + 20)]
    future = [("future", "open", NOW + timedelta(minutes=30))]
    await pool.executemany(
        "INSERT INTO proj_pending_actions.pending_actions VALUES ($1, $2, $3)", due + future
    )
    router = StandInRouter()
    clock = ExpiryClock(pool, router, lambda: NOW)

    next_at = await clock._expire_due()
    assert sorted(router.seen) == [row[0] for row in due]  # each once, none left for later
    assert next_at == NOW + timedelta(minutes=30)
