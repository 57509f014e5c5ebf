"""The expiry clock on a real Postgres read model: oldest deadlines first, and an action whose
expiry the session service refuses is set aside instead of starving the rest.

The command router here is a recording stand-in (the clock's only collaborator besides the
read model); expiry through the real session service is covered by the e2e tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from suzumio.contracts.commands import CommandAccepted, CommandRejected, CommandRequest
from suzumio.contracts.errors import ConflictError
from suzumio.platform.db.pool import Pool
from suzumio.session.expiry import MAX_SLEEP, RECHECK, VISIBLE_WITHIN, ExpiryClock

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


class RecordingRouter:
    def __init__(self, refuse: set[str]) -> None:
        self.refuse = refuse
        self.seen: list[str] = []

    async def dispatch(self, request: CommandRequest) -> CommandAccepted | CommandRejected:
        action_id = str(request.data["pending_action_id"])
        self.seen.append(action_id)
        if action_id in self.refuse:
            return CommandRejected(error=ConflictError("cannot expire this one").to_body())
        return CommandAccepted()


async def test_oldest_first_and_refused_ones_are_set_aside(pool: Pool) -> None:
    await pool.execute(
        "CREATE SCHEMA proj_pending_actions;"
        " CREATE TABLE proj_pending_actions.pending_actions"
        " (id text PRIMARY KEY, status text NOT NULL, expires_at timestamptz NOT NULL)"
    )
    rows = [
        ("late", "open", NOW - timedelta(seconds=1)),
        ("stuck", "open", NOW - timedelta(hours=2)),
        ("early", "open", NOW - timedelta(hours=1)),
        ("done", "answered", NOW - timedelta(hours=3)),
        ("future", "open", NOW + timedelta(minutes=5)),
    ]
    await pool.executemany(
        "INSERT INTO proj_pending_actions.pending_actions VALUES ($1, $2, $3)", rows
    )
    router = RecordingRouter(refuse={"stuck"})
    clock = ExpiryClock(pool, router, lambda: NOW)

    next_at = await clock._expire_due()
    assert router.seen == ["stuck", "early", "late"]
    assert next_at == NOW + timedelta(minutes=5)

    router.seen.clear()  # nothing was really expired (the stand-in changes no rows)
    await clock._expire_due()
    assert router.seen == ["early", "late"]  # `stuck` waits out its back-off


async def test_a_deadline_passed_before_its_row_shows_is_looked_for_again_soon(
    pool: Pool,
) -> None:
    """The process created a pending action whose deadline passes before the read model
    shows its row: the pass finds nothing due, and the next deadline the read model knows is
    far. It must look again in a moment, not sleep the full minute; once the row has been
    expired (or after VISIBLE_WITHIN), the minute again."""
    await pool.execute(
        "CREATE SCHEMA proj_pending_actions;"
        " CREATE TABLE proj_pending_actions.pending_actions"
        " (id text PRIMARY KEY, status text NOT NULL, expires_at timestamptz NOT NULL)"
    )
    now = NOW
    router = RecordingRouter(refuse=set())
    clock = ExpiryClock(pool, router, lambda: now)
    clock.notify("q", NOW - timedelta(milliseconds=100))
    # Another action, due later, whose row does show: its being met says nothing of `q`'s.
    await pool.execute(
        "INSERT INTO proj_pending_actions.pending_actions VALUES ('other', 'open', $1)",
        NOW - timedelta(milliseconds=50),
    )
    assert await clock._expire_due() is None
    assert router.seen == ["other"]
    assert clock._sleep(None) <= RECHECK.total_seconds()  # `q` not shown yet: soon again

    await pool.execute(
        "INSERT INTO proj_pending_actions.pending_actions VALUES ('q', 'open', $1)",
        NOW - timedelta(milliseconds=100),
    )
    assert await clock._expire_due() is None
    assert router.seen == ["other", "q", "other"]  # (the stand-in changes no rows)
    assert clock._sleep(None) == MAX_SLEEP.total_seconds()  # shown: the read model's again

    clock.notify("never", NOW + timedelta(seconds=1))
    now = NOW + timedelta(seconds=1) + VISIBLE_WITHIN + timedelta(seconds=1)
    assert clock._sleep(None) == MAX_SLEEP.total_seconds()  # never showed: given up


async def test_a_far_deadline_is_left_to_the_read_model_and_a_near_one_watched(
    pool: Pool,
) -> None:
    """Every action this process created was watched until its deadline (up to 30 days)
    and every create scanned them all: a runner asking in a loop grew the watch without bound
    and made each create slower. A far deadline's row shows in the read model long before it
    is due, and each pass (a minute apart at most) reads the next deadline there; only one
    due before that needs watching."""
    await pool.execute(
        "CREATE SCHEMA proj_pending_actions;"
        " CREATE TABLE proj_pending_actions.pending_actions"
        " (id text PRIMARY KEY, status text NOT NULL, expires_at timestamptz NOT NULL)"
    )
    clock = ExpiryClock(pool, RecordingRouter(refuse=set()), lambda: NOW)
    for i in range(10_000):
        clock.notify(f"far{i}", NOW + timedelta(days=30))
    assert clock._sleep(None) == MAX_SLEEP.total_seconds()  # nothing of them to wake for
    assert len(clock._watch) == 0
    clock.notify("near", NOW + timedelta(seconds=5))
    assert clock._sleep(None) == 5.0  # woken for it, whether its row shows by then or not
