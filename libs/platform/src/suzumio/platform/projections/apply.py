"""Applying a batch of log entries to projections, one savepoint per projection.

A projection that fails on a batch is retried event by event to find the culprit. A culprit
that keeps failing (or cannot even be decoded) is parked for that projection and skipped, so
one bad event never stops a projection; anything else aborts the batch to be retried whole.

The savepoints cost two round trips to Postgres per projection and batch, for a failure that
almost never comes: the live projector applies its batches without them first
(`guarded=False`, a failure rolls the whole batch back) and only a batch that failed so goes
again with them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from suzumio.contracts.envelope import DomainEvent, RecordedEvent
from suzumio.platform.db.pool import Connection
from suzumio.platform.db.trouble import is_postgres_trouble
from suzumio.platform.projections.base import Projection
from suzumio.platform.projections.decoding import LogEntry, concerns


def is_infrastructure(exc: BaseException) -> bool:
    """Whether `exc` says nothing about the event: the connection or the server is in trouble.
    Counted as the event's failure it would park the event (skip it for good) after three
    tries, though the server would take it once it recovered. (Not a cancelled statement,
    57014: a statement timeout may be the batch's size, which the event-by-event retry cures.
    Nor asyncpg's InterfaceError of a connection misused, a bug in the projection: parked,
    with the error recorded, like any other.)"""
    return isinstance(exc, OSError) or is_postgres_trouble(exc)


@dataclass(frozen=True, slots=True)
class Parked:
    projection: str
    seq: int
    subject: str
    type: str
    error: str


class RetryBatchError(RuntimeError):
    """An event failed but has attempts left: roll back and try the batch again later."""


@dataclass
class PoisonTracker:
    """Counts failures per (projection, seq) across retries of a batch."""

    max_attempts: int = 3
    _failures: dict[tuple[str, int, str], int] = field(default_factory=dict)

    def spent(self, projection: str, seq: int, event_id: str = "") -> bool:
        key = (projection, seq, event_id)
        self._failures[key] = self._failures.get(key, 0) + 1
        return self._failures[key] >= self.max_attempts

    def forget_through(self, seq: int) -> None:
        self._failures = {k: v for k, v in self._failures.items() if k[1] > seq}


def first_newer(projection: Projection, entries: Sequence[LogEntry]) -> LogEntry | None:
    """The first entry this projection handles whose schema is newer than this code's."""
    return next((e for e in entries if e.newer and concerns(projection.handles, e.newer)), None)


async def apply_entries(
    conn: Connection,
    projection: Projection,
    schema: str,
    entries: Sequence[LogEntry],
    tracker: PoisonTracker,
    *,
    guarded: bool = True,
) -> list[Parked]:
    """Apply the events of `entries` this projection handles; returns what had to be parked.
    Unless `guarded`, they are applied without a savepoint, and whatever fails is raised (the
    caller rolls the batch back and applies it again guarded).

    An event of a schema newer than this code stops the projection instead (it would be lost
    if skipped): the batch is retried until a newer release takes over. (The live projector
    holds only the projection concerned, at that event: see `first_newer`.)
    """
    newer = first_newer(projection, entries)
    if newer is not None:
        raise RetryBatchError(f"seq {newer.seq} needs a newer release: {newer.error}")
    parked = [
        Parked(projection.name, e.seq, e.subject, ",".join(e.failed), e.error)
        for e in entries
        if e.error is not None and e.failed and concerns(projection.handles, e.failed)
    ]
    events = [
        (e.subject, event)
        for e in entries
        for event in e.events
        if event.type in projection.handles
    ]
    if not events:
        return parked
    if not guarded:
        await projection.apply(conn, schema, [event for _, event in events])
        return parked
    try:
        async with conn.transaction():  # a savepoint inside the batch transaction
            await projection.apply(conn, schema, [event for _, event in events])
    except Exception as exc:
        if is_infrastructure(exc):
            raise
        return parked + await _one_by_one(conn, projection, schema, events, tracker)
    return parked


async def _one_by_one(
    conn: Connection,
    projection: Projection,
    schema: str,
    events: list[tuple[str, RecordedEvent[DomainEvent]]],
    tracker: PoisonTracker,
) -> list[Parked]:
    """Each event in a savepoint of its own. Every one that fails counts an attempt — not only
    the first: stopped there, a batch with k failing events was rolled back and tried again
    about 2k times, every projection frozen meanwhile (minutes for a few hundred) — and the
    batch is tried again while any has attempts left; then they are parked."""
    parked: list[Parked] = []
    again: tuple[int, BaseException] | None = None  # the first failure with attempts left
    for subject, event in events:
        try:
            async with conn.transaction():
                await projection.apply(conn, schema, [event])
        except Exception as exc:
            if is_infrastructure(exc):
                raise
            if not tracker.spent(projection.name, event.seq, event.id):
                again = again or (event.seq, exc)
                continue
            error = f"{type(exc).__name__}: {exc}"[:2_000]
            parked.append(Parked(projection.name, event.seq, subject, event.type, error))
    if again is not None:
        seq, cause = again
        raise RetryBatchError(f"{projection.name} failed on seq {seq}") from cause
    return parked
