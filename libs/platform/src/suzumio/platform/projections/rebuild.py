"""Rebuilding projections: replay the log from sequence 1 into fresh tables, then swap them in.

The replay reads the log once for all the projections being rebuilt (only the aggregates they
read) and writes into one staging schema each, while the live tables keep serving. The swap
takes the projections' checkpoint row locks (so the live projector cannot commit meanwhile),
applies the events that arrived since the replay caught up (within a batch of the end),
renames each staging schema over its live one and sets the checkpoints, all in one
transaction: readers see the old tables or the new, never a mix. The old tables are dropped
after the commit, once their last readers let go. A projection that meets an event of a
schema newer than this code (written by a newer release, mid-upgrade) stops just before it
and is swapped in there, as the live projector would hold it; the others go on to the end.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import asyncpg
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.jsapi import stream_last_seq, stream_state
from suzumio.platform.db import pool as db
from suzumio.platform.db.pool import Connection
from suzumio.platform.logging import get_logger
from suzumio.platform.projections import checkpoints
from suzumio.platform.projections.apply import Parked, PoisonTracker, apply_entries, first_newer
from suzumio.platform.projections.base import Projection, live_schema
from suzumio.platform.projections.decoding import decode_entry
from suzumio.platform.projections.positions import notify
from suzumio.platform.projections.reader import LogReader

log = get_logger(__name__)


STALL_SECONDS = 60.0
CATCH_UP_ROUNDS = 5  # replays of what came meanwhile before the swap takes the rest
DROP_OLD_WAIT_SECONDS = 5.0  # for the readers of the tables swapped out, before they stay


class RebuildInProgressError(RuntimeError):
    pass


class RebuildStalledError(RuntimeError):
    """The log stopped delivering before the replay reached its end."""


class RebuildGapError(RebuildStalledError):
    """The replay's consumer skipped an event (lost on the way: it acks nothing, so nothing is
    sent again): swapped in, the tables would lack it for good."""


@dataclass
class RebuildResult:
    projection: str
    schema: str
    position: int
    events: int
    seconds: float
    swapped: bool
    parked: list[Parked] = field(default_factory=list)
    held_at: int | None = None  # the event of a newer schema it stopped before


async def _close_to_the_end(
    nc: NATS, topology: Topology, replay: _Replay, reader: LogReader, batch: int
) -> None:
    """Replay on until at most a batch of the log is left, before the swap locks every
    checkpoint row: what came while the whole log was replayed (an hour's worth of a busy
    platform) was applied inside the swap, the live projector held at those locks meanwhile
    and every write's read-your-writes wait running out. A log that never slows down gets a
    few rounds; the swap takes the rest."""
    for _ in range(CATCH_UP_ROUNDS):
        last = await stream_last_seq(nc, topology.events_stream)
        if last - replay.position <= batch:
            return
        await replay.until(reader, last)


def staging_schema(name: str) -> str:
    return f"{live_schema(name)}__next"


async def rebuild(
    nc: NATS,
    dsn: str,
    topology: Topology,
    projections: Sequence[Projection],
    *,
    swap: bool = True,
    schemas: Mapping[str, str] | None = None,
    batch: int = 2_000,
    record_parked: Callable[[list[Parked]], Awaitable[None]] | None = None,
) -> list[RebuildResult]:
    """Replay the log into a schema per projection (default: its staging schema) and, if
    `swap`, make those the live ones. Without `swap` the rebuilt tables stay where they were
    built, e.g. to compare them with the live ones.

    `record_parked` records the events the rebuild gave up on before the swap commits; if it
    fails, nothing is swapped (the skipped events must not go without a trace)."""
    started = time.perf_counter()
    targets = {p.name: (schemas or {}).get(p.name, staging_schema(p.name)) for p in projections}
    conn = await db.connect(dsn, "suzumio-rebuild")
    try:
        await _lock(conn, [p.name for p in projections])
        for p in projections:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{targets[p.name]}" CASCADE')
            await conn.execute(f'CREATE SCHEMA "{targets[p.name]}"')
            await conn.execute(p.ddl(f'"{targets[p.name]}"'))
        first = int((await stream_state(nc, topology.events_stream)).get("first_seq") or 1)
        replay = _Replay(conn, projections, targets, first)
        async with LogReader(nc, topology, start_seq=1, batch=batch) as reader:
            await replay.until(reader, await stream_last_seq(nc, topology.events_stream))
            if swap:
                await _close_to_the_end(nc, topology, replay, reader, batch)
                swapping = conn.transaction()
                await swapping.start()
                try:
                    await checkpoints.ensure_rows(conn, projections)
                    await checkpoints.lock_rows(conn, sorted(targets))
                    await replay.until(reader, await stream_last_seq(nc, topology.events_stream))
                    # Before the renames, whose locks readers of the live tables queue behind:
                    # the parking's round trips to NATS held every read of them meanwhile.
                    if record_parked is not None and replay.parked:
                        await record_parked(replay.parked)
                    for p in projections:
                        await _swap_in(
                            conn,
                            p,
                            targets[p.name],
                            replay.position_of(p.name),
                            serving=p.name not in replay.held,
                        )
                    await notify(conn, replay.position)
                except BaseException:
                    # Dropped, not rolled back: the server rolls back what a lost connection
                    # began, and a ROLLBACK after a cancel (Ctrl-C while the swap waits for a
                    # lock) first waits for the cancelled statement, i.e. for that lock.
                    conn.terminate()
                    raise
                await swapping.commit()
                await _drop_old(conn, projections)
        seconds = time.perf_counter() - started
        log.info(
            "projections.rebuilt",
            projections=sorted(targets),
            position=replay.position,
            events=replay.events,
            seconds=round(seconds, 2),
            swapped=swap,
        )
        return [
            RebuildResult(
                p.name,
                live_schema(p.name) if swap else targets[p.name],
                replay.position_of(p.name),
                replay.events,
                seconds,
                swap,
                [x for x in replay.parked if x.projection == p.name],
                replay.held.get(p.name),
            )
            for p in projections
        ]
    except BaseException:
        conn.terminate()  # as above: a cancelled statement is not waited for
        raise
    finally:
        if not conn.is_closed():
            await conn.close()  # also releases the session-level rebuild locks


async def _lock(conn: Connection, names: list[str]) -> None:
    for name in sorted(names):
        lock = "SELECT pg_try_advisory_lock(hashtext('suzumio.rebuild.' || $1))"
        if not await conn.fetchval(lock, name):
            raise RebuildInProgressError(f"a rebuild of {name} is already running")


async def _swap_in(
    conn: Connection, projection: Projection, staging: str, position: int, *, serving: bool
) -> None:
    """`serving`: False for one held at an event of a newer schema (frozen there, as the live
    projector leaves one it holds)."""
    live = live_schema(projection.name)
    old = f"{live}__old"
    await conn.execute(f'DROP SCHEMA IF EXISTS "{old}" CASCADE')
    exists = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", live
    )
    if exists:
        await conn.execute(f'ALTER SCHEMA "{live}" RENAME TO "{old}"')
    await conn.execute(f'ALTER SCHEMA "{staging}" RENAME TO "{live}"')
    await conn.execute(
        "UPDATE suzumio.projection_checkpoints SET position = $2, version = $3,"
        " schema_name = $4, serving = $5, rebuilt_at = now(), updated_at = now()"
        " WHERE name = $1",
        projection.name,
        position,
        projection.version,
        live,
        serving,
    )


async def _drop_old(conn: Connection, projections: Sequence[Projection]) -> None:
    """The tables swapped out, dropped once the swap committed — not inside it: the drop
    waits for every reader still in a transaction over them, and within the swap it held the
    checkpoints (the live projector) and every new read of the tables behind it. A reader
    that keeps them past `DROP_OLD_WAIT_SECONDS` leaves them to the next rebuild's swap."""
    # The swap is done whatever happens here: a failure leaves the old tables to the next
    # rebuild's swap, never makes the rebuild look failed (its caller would replay it all).
    try:
        await conn.execute(f"SET lock_timeout = {int(DROP_OLD_WAIT_SECONDS * 1000)}")
        for p in projections:
            old = f"{live_schema(p.name)}__old"
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{old}" CASCADE')
            except asyncpg.LockNotAvailableError:
                log.warning("projections.old_tables_kept", schema=old)
        await conn.execute("RESET lock_timeout")
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
        log.warning("projections.old_tables_drop_failed", error=repr(exc))


class _Replay:
    """Applies the log to the projections' target schemas, remembering how far it got."""

    def __init__(
        self,
        conn: Connection,
        projections: Sequence[Projection],
        schemas: Mapping[str, str],
        first_seq: int = 1,
    ) -> None:
        """`first_seq`: the log's first message when the rebuild began (past 1 only if the
        stream's limits let earlier ones go)."""
        self._conn = conn
        self._first_seq = first_seq
        self._projections = projections
        self._schemas = schemas
        self._handles = frozenset().union(*(p.handles for p in projections))
        self.position = 0
        self.events = 0
        self.parked: list[Parked] = []
        # A projection that met an event of a schema newer than this code stops before it,
        # as the live projector holds it there: seq of that event, by projection.
        self.held: dict[str, int] = {}
        self._tracker = PoisonTracker(max_attempts=1)  # replaying: a failure will not heal

    def position_of(self, name: str) -> int:
        """How far the projection got: before the event it is held at, else all the way."""
        return self.held[name] - 1 if name in self.held else self.position

    def _follows_on(self, msgs: list[Msg]) -> None:
        """The log holds every sequence (nothing is deleted from it), so each message must
        be the one after the last: a hole is an event lost in delivery — a reconnect, or the
        client's pending limit overflowing while a batch was written. The first must be the
        log's first: taken as delivered, a first fetch lost on the way moved the start on,
        and the rebuilt tables lacked the earliest events (the first users, the projects)."""
        seqs = [m.metadata.sequence.stream for m in msgs]
        first = self.position + 1 if self.position else self._first_seq
        if seqs != list(range(first, first + len(seqs))):
            raise RebuildGapError(
                f"the log delivered {seqs[0]}..{seqs[-1]} ({len(seqs)}) after {self.position}: "
                "an event was lost on the way"
            )

    async def until(self, reader: LogReader, target: int) -> None:
        """Apply everything up to (at least) `target`, the log's last sequence when called.
        An empty fetch is not the end (the server may just be slow): stop on `target`."""
        quiet_since = time.monotonic()
        while self.position < target:
            msgs = await reader.fetch(timeout=1.0)
            if not msgs:
                if time.monotonic() - quiet_since > STALL_SECONDS:
                    raise RebuildStalledError(
                        f"no event after {self.position} for {STALL_SECONDS:.0f}s, {target} due"
                    )
                continue
            quiet_since = time.monotonic()
            self._follows_on(msgs)
            entries = [
                decode_entry(
                    m.metadata.sequence.stream, m.subject, m.headers, m.data, self._handles
                )
                for m in msgs
            ]
            async with self._conn.transaction():
                for p in self._projections:
                    if p.name in self.held:
                        continue
                    mine = entries
                    newer = first_newer(p, entries)
                    if newer is not None:
                        mine = [e for e in entries if e.seq < newer.seq]
                        self.held[p.name] = newer.seq
                        log.warning(
                            "projections.rebuild_held",
                            projection=p.name,
                            seq=newer.seq,
                            error=newer.error,
                        )
                    self.parked += await apply_entries(
                        self._conn, p, f'"{self._schemas[p.name]}"', mine, self._tracker
                    )
            self.events += sum(len(e.types) for e in entries)
            # Only as far as delivered: the log holds every sequence up to `target` (nothing
            # is deleted from it), and a message's `num_pending` of 0 is no end — it may
            # have been delivered before the log grew (left over from an earlier fetch), and
            # taken for the end it swapped the projection in without the events between.
            self.position = entries[-1].seq
