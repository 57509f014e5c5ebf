"""The live projector: one durable consumer of the whole log feeding a set of projections.

Exactly-once effect: each batch is applied in one transaction that also moves every
projection's checkpoint, and acknowledged only after commit; an event at or below a
projection's checkpoint is skipped, so redelivery and replay change nothing. Order: the log's
sequences are contiguous (EVENTS denies deletes), so a batch that does not continue exactly
where the checkpoints stand is refused and the consumer is reset to the right place.

One projector leads per projector name across all replicas: it holds a Postgres advisory lock
on the very connection that runs its transactions, so a leader that lost its connection has
lost both its lock and any chance to commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from suzumio.contracts.subjects import Topology
from suzumio.platform import telemetry
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.bus.jsapi import stream_last_seq
from suzumio.platform.db import pool as db
from suzumio.platform.db.pool import Connection
from suzumio.platform.logging import get_logger
from suzumio.platform.projections import checkpoints
from suzumio.platform.projections.apply import (
    Parked,
    PoisonTracker,
    RetryBatchError,
    apply_entries,
    first_newer,
    is_infrastructure,
)
from suzumio.platform.projections.base import Projection, live_schema
from suzumio.platform.projections.decoding import LogEntry, decode_entry
from suzumio.platform.projections.parking import record_parked
from suzumio.platform.projections.reader import FetchSize
from suzumio.platform.projections.rebuild import RebuildInProgressError, rebuild

log = get_logger(__name__)

LOG_BEHIND_RETRY_SECONDS = 30.0  # how often a log behind the read models is looked at again
# A projection a later release built is left to it while a projector of that release was seen
# this recently (each one says so every ANNOUNCE_SECONDS as long as it runs, leading or not);
# after that, the release is taken for rolled back, and the projection is built down to this
# code's version. Long enough to ride out a later release's restarts mid-upgrade.
LATER_RELEASE_SECONDS = 120.0
LATER_RELEASE_CHECK_SECONDS = 10.0  # how often a leader looks whether that release is gone
ANNOUNCE_SECONDS = 5.0

_applied = telemetry.meter.create_counter(
    "suzumio_projector_events", description="log entries the projector went through"
)
_batch_seconds = telemetry.meter.create_histogram(
    "suzumio_projector_batch_duration",
    unit="s",
    description="one batch transaction",
    explicit_bucket_boundaries_advisory=telemetry.LATENCY_BUCKETS,
)


class LogBehindError(Exception):
    """The read models stand past the log's end: the log is not the one they were built
    from (its storage lost or replaced while Postgres kept its data), or it lost its tail.
    Projecting on would skip every new event up to the checkpoints, silently; the projector
    waits instead, for the log to be restored or the projections rebuilt from it
    (`suzumio projections rebuild`)."""

    def __init__(self, last_seq: int, ahead: dict[str, int]) -> None:
        listed = ", ".join(f"{name} at {position}" for name, position in sorted(ahead.items()))
        super().__init__(
            f"the event log ends at {last_seq}; the read models stand past it: {listed}"
        )
        self.last_seq = last_seq
        self.ahead = ahead


class _ResetError(Exception):
    def __init__(self, seq: int, why: str) -> None:
        super().__init__(why)
        self.seq = seq


def _recoverable(exc: BaseException) -> bool:
    """A failure the leader survives by connecting and leading again: NATS's or Postgres's."""
    return isinstance(exc, NatsError) or is_infrastructure(exc)  # TimeoutError is an OSError


def _not_the_events(exc: BaseException) -> bool:
    """A failure of a batch that no savepoint would help with: the connection's, the order's."""
    return isinstance(exc, _ResetError | RetryBatchError) or is_infrastructure(exc)


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep up to `seconds`; True if `stop` was set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


class Projector:
    def __init__(
        self,
        nc: NATS,
        dsn: str,
        topology: Topology,
        projections: Sequence[Projection],
        store: EventStore,
        *,
        durable: str = "projector",
        batch: int = 1_000,
    ) -> None:
        self._nc = nc
        self._js = nc.jetstream()
        self._dsn = dsn
        self._topology = topology
        self._projections = list(projections)
        self._names = sorted(p.name for p in projections)
        self._store = store
        self._durable = durable
        self._batch = batch
        self._next = 1
        self._tracker = PoisonTracker()
        self._held: set[str] = set()  # projections stopped at an event of a newer schema
        self._build_task: asyncio.Task[None] | None = None
        self._building: set[str] = set()  # the projections `_build_task` builds
        # Outdated projections not built now: left to a later release while it is around, or
        # waiting for the build under way; looked at again every LATER_RELEASE_CHECK_SECONDS.
        self._deferred: set[str] = set()
        self._looked_at = 0.0
        self.leading = False

    async def run(self, stop: asyncio.Event) -> None:
        """Lead (or stand by) until `stop` is set, surviving NATS and Postgres outages."""
        announcing = asyncio.create_task(self._announce(stop))
        try:
            await self._run(stop)
        finally:
            announcing.cancel()
            await asyncio.wait({announcing})  # a cancel of `run` itself still propagates

    async def _announce(self, stop: asyncio.Event) -> None:
        """Say, as long as this projector runs, which projection versions it builds: an
        earlier release that comes to lead leaves them to this one meanwhile (`_outdated`)."""
        conn: Connection | None = None
        try:
            while not stop.is_set():
                try:
                    if conn is None or conn.is_closed():
                        conn = await db.connect(self._dsn, f"suzumio-{self._durable}-presence")
                    await checkpoints.announce(conn, self._projections)
                except Exception as exc:  # tried again: the leading goes on meanwhile
                    log.warning("projector.announce_failed", error=repr(exc))
                    if conn is not None:
                        conn.terminate()  # a close could wait on a dead network
                    conn = None
                if await _wait(stop, ANNOUNCE_SECONDS):
                    break
        finally:
            if conn is not None:
                conn.terminate()  # not `close`: it waits on a cancelled query, unbounded

    async def _run(self, stop: asyncio.Event) -> None:
        delay = 0.5
        while not stop.is_set():
            try:
                await self._lead(stop)
                delay = 0.5
            except LogBehindError as exc:  # looked at again now and then; readiness says it
                log.error("projector.log_behind_checkpoints", error=str(exc))  # noqa: TRY400
                self.leading = False
                if await _wait(stop, LOG_BEHIND_RETRY_SECONDS):
                    return
                continue
            except Exception as exc:
                if not _recoverable(exc):
                    raise
                log.warning("projector.interrupted", error=repr(exc))
            finally:
                self.leading = False
            if await _wait(stop, delay):
                return
            delay = min(delay * 2, 10.0)

    async def _lead(self, stop: asyncio.Event) -> None:
        conn = await db.connect(self._dsn, f"suzumio-{self._durable}")
        try:
            lock = "SELECT pg_try_advisory_lock(hashtext('suzumio.projector.' || $1))"
            while not await conn.fetchval(lock, self._durable):
                if await _wait(stop, 2.0):
                    return
            self.leading = True
            log.info("projector.leading", projector=self._durable, projections=self._names)
            await checkpoints.ensure_rows(conn, self._projections)
            await checkpoints.mark_serving(conn, self._projections)
            await self._consume(conn, stop)
        finally:
            if self._build_task is not None:
                self._build_task.cancel()
                self._build_task = None
            self._building = set()  # the cancelled build's own end no longer clears it
            with contextlib.suppress(Exception):
                await conn.close()

    # -- building projections whose tables are missing or outdated ---------------------------
    async def _start_builds(self, conn: Connection) -> None:
        """Build the projections whose tables are missing or not of this code's version."""
        self._start_build(await self._outdated(conn, set(self._names)))

    async def _rebuilt_elsewhere(self, conn: Connection, names: set[str]) -> None:
        """Projections whose tables another release swapped in while this one leads (`suzumio
        projections rebuild` of another version): this code cannot apply to them, and, left
        serving, they held every read-your-writes wait at their checkpoint for good. They
        stop serving and are built again, to this code's version (one of a later release only
        once that release is gone: `_outdated`)."""
        if not names:
            return
        log.warning("projector.rebuilt_elsewhere", projections=sorted(names))
        await self._mark_serving(conn)
        self._start_build(await self._outdated(conn, names))

    async def _outdated(self, conn: Connection, names: set[str]) -> list[Projection]:
        """Of the named projections, those to build to this code's version: missing, of an
        earlier version, or of a later release no projector of which has been seen for
        `LATER_RELEASE_SECONDS` (rolled back). One of a later release still around is left to
        it, not serving (`_deferred`): built down here while that release runs, mid-upgrade, the
        two undid each other's work whenever the lead changed hands."""
        rows = await checkpoints.read_rows(conn, sorted(names))
        mine = [p for p in self._projections if p.name in rows]
        later = {p.name for p in mine if rows[p.name].version > p.version}
        around = await checkpoints.versions_around(conn, sorted(later), LATER_RELEASE_SECONDS)
        left = {n for n in later if around.get(n, checkpoints.NOT_BUILT) >= rows[n].version}
        if fresh := left - self._deferred:
            log.warning("projector.left_to_a_later_release", projections=sorted(fresh))
        if gone := later - left:
            log.warning("projector.later_release_gone", projections=sorted(gone))
        self._deferred = (self._deferred - names) | left
        return [p for p in mine if rows[p.name].version != p.version and p.name not in left]

    def _start_build(self, projections: list[Projection]) -> None:
        """Build `projections` aside; while a build runs, they wait (`_deferred`) to be looked
        at again (`_look_again`)."""
        if not projections:
            return
        if self._build_task is not None and not self._build_task.done():
            self._deferred |= {p.name for p in projections}
            return
        self._building = {p.name for p in projections}
        self._deferred -= self._building
        self._build_task = asyncio.create_task(self._build(projections))

    async def _mark_serving(self, conn: Connection) -> None:
        """Those at this code's version serve, but the held ones (frozen at an event of a
        newer schema until the next leader meets it again)."""
        await checkpoints.mark_serving(
            conn, [p for p in self._projections if p.name not in self._held]
        )

    async def _look_again(self, conn: Connection) -> None:
        """Now and then, while outdated projections wait: build those whose later release is
        gone (rolled back), or that waited for a build that has ended."""
        now = time.monotonic()
        if not self._deferred or now < self._looked_at + LATER_RELEASE_CHECK_SECONDS:
            return
        self._looked_at = now
        # Another release may have swapped one of them in meanwhile (`suzumio projections
        # rebuild`), which marked it serving: not advanced here, it must not say so.
        await self._mark_serving(conn)
        self._start_build(await self._outdated(conn, set(self._deferred)))

    async def _build(self, projections: list[Projection]) -> None:
        """Build outdated projections from the log, aside, while the others keep going."""

        async def record(parked: list[Parked]) -> None:
            await record_parked(
                self._store, parked, consumer=self._durable, attempts=1, strict=True
            )

        try:
            await self._build_until_done(projections, record)
        finally:
            if asyncio.current_task() is self._build_task:  # not a cancelled one's late end
                self._building = set()

    async def _build_until_done(
        self,
        projections: list[Projection],
        record: Callable[[list[Parked]], Awaitable[None]],
    ) -> None:
        while True:
            try:
                await rebuild(
                    self._nc, self._dsn, self._topology, projections, record_parked=record
                )
            except RebuildInProgressError:
                await asyncio.sleep(2.0)  # someone else rebuilds; their swap enables it
                rows = await self._read_rows()
                # One of a later release (swapped in meanwhile, or one this build was to build
                # down) is looked at again (`_look_again`): left to that release while it is
                # around, built down after.
                self._deferred |= {p.name for p in projections if rows[p.name].version > p.version}
                projections = [p for p in projections if rows[p.name].version < p.version]
                if not projections:
                    return
                continue
            except Exception:
                log.exception("projector.build_failed", projections=[p.name for p in projections])
                await asyncio.sleep(5.0)
                continue
            return

    async def _read_rows(self) -> dict[str, checkpoints.Checkpoint]:
        conn = await db.connect(self._dsn, f"suzumio-{self._durable}-probe")
        try:
            return await checkpoints.read_rows(conn, self._names)
        finally:
            await conn.close()

    # -- the consume loop ------------------------------------------------------------------
    async def _consume(self, conn: Connection, stop: asyncio.Event) -> None:
        self._held.clear()  # from the lowest checkpoint, each one meets its event again
        self._deferred.clear()
        await self._start_builds(conn)
        await self._ensure_consumer()
        await self._check_log_holds_checkpoints(conn)
        self._next = await self._start_position(conn)
        psub = await self._bind(self._next)
        size = FetchSize(self._batch)
        try:
            while not stop.is_set():
                await self._look_again(conn)
                try:
                    msgs = await psub.fetch(size.next, timeout=1.0)
                except TimeoutError:
                    continue
                size.took(msgs)
                try:
                    await self._handle(conn, msgs)
                except _ResetError as reset:
                    log.warning("projector.reset", to_seq=reset.seq, why=str(reset))
                    await psub.unsubscribe()
                    self._next = reset.seq
                    psub = await self._bind(reset.seq)
        finally:
            with contextlib.suppress(Exception):
                await psub.unsubscribe()

    async def _ensure_consumer(self) -> None:
        config = ConsumerConfig(
            durable_name=self._durable,
            ack_policy=AckPolicy.ALL,
            deliver_policy=DeliverPolicy.ALL,
            filter_subject=self._topology.events_filter(),
            ack_wait=120.0,
            max_ack_pending=-1,
            max_deliver=-1,
        )
        await self._js.add_consumer(self._topology.events_stream, config)

    async def _check_log_holds_checkpoints(self, conn: Connection) -> None:
        """Raises LogBehindError if a projection of this code's version stands past the log's
        last sequence. The checkpoints are read first: only this leader moves them, and the
        log only grows, so a checkpoint read first is never past a log end read after."""
        rows = await checkpoints.read_rows(conn, self._names)
        last = await stream_last_seq(self._nc, self._topology.events_stream)
        ahead = {
            p.name: rows[p.name].position
            for p in self._projections
            if rows[p.name].version == p.version and rows[p.name].position > last
        }
        if ahead:
            raise LogBehindError(last, ahead)

    async def _start_position(self, conn: Connection) -> int:
        rows = await checkpoints.read_rows(conn, self._names)
        enabled = [
            rows[p.name].position for p in self._projections if rows[p.name].version == p.version
        ]
        if enabled:
            return min(enabled) + 1
        return await stream_last_seq(self._nc, self._topology.events_stream) + 1

    async def _bind(self, seq: int) -> JetStreamContext.PullSubscription:
        """Point the durable consumer at `seq` and subscribe afresh (dropping stale pulls)."""
        try:
            await self._js.reset_consumer(self._topology.events_stream, self._durable, seq=seq)
        except NotFoundError:
            await self._ensure_consumer()
            await self._js.reset_consumer(self._topology.events_stream, self._durable, seq=seq)
        return await self._js.pull_subscribe_bind(
            self._durable, stream=self._topology.events_stream
        )

    async def _handle(self, conn: Connection, msgs: list[Msg]) -> None:
        if not msgs:
            return
        fresh = [m for m in msgs if m.metadata.sequence.stream >= self._next]
        if not fresh:
            await msgs[-1].ack()  # redeliveries of what is applied already
            return
        seqs = [m.metadata.sequence.stream for m in fresh]
        if seqs != list(range(self._next, self._next + len(seqs))):  # in order, none twice
            raise _ResetError(self._next, f"expected seq {self._next}, got {seqs[0]}..")
        wanted = frozenset().union(*(p.handles for p in self._projections))
        entries = [
            decode_entry(s, m.subject, m.headers, m.data, wanted)
            for s, m in zip(seqs, fresh, strict=True)
        ]
        started = time.perf_counter()
        try:
            parked = await self._apply(conn, entries)
        except RetryBatchError as exc:
            log.warning("projector.retrying_batch", error=str(exc), cause=repr(exc.__cause__))
            await asyncio.sleep(1.0)
            raise _ResetError(self._next, "retrying a failed batch") from exc
        _batch_seconds.record(time.perf_counter() - started)
        await fresh[-1].ack()  # AckAll: acknowledges the whole batch, after commit
        self._next = seqs[-1] + 1
        self._tracker.forget_through(seqs[-1])
        _applied.add(len(entries), {"projector": self._durable})
        if parked:
            log.info("projector.parked", count=len(parked), through=seqs[-1])

    async def _apply(self, conn: Connection, entries: list[LogEntry]) -> list[Parked]:
        try:
            return await self._transaction(conn, entries, guarded=False)
        except Exception as exc:
            if _not_the_events(exc):
                raise
            # A projection failed on an event of the batch (rolled back whole): again, each
            # projection in a savepoint of its own, to find the event and park it if spent.
            log.info("projector.batch_guarded", error=repr(exc))
            return await self._transaction(conn, entries, guarded=True)

    async def _transaction(
        self, conn: Connection, entries: list[LogEntry], *, guarded: bool
    ) -> list[Parked]:
        first, last = entries[0].seq, entries[-1].seq
        parked: list[Parked] = []
        held: set[str] = set()
        async with conn.transaction():
            rows = await checkpoints.lock_rows(conn, self._names)
            outdated = {p.name for p in self._projections if rows[p.name].version != p.version}
            foreign = outdated - self._building - self._deferred  # swapped in elsewhere
            moves: dict[str, int] = {}
            for p in self._projections:
                row = rows[p.name]
                if p.name in outdated:
                    continue  # being built; the build's swap will bring it up to date
                if p.name in self._held:
                    continue  # waits, at its checkpoint, for a release that can read on
                if row.position < first - 1:
                    raise _ResetError(row.position + 1, f"{p.name} stands at {row.position}")
                todo = [e for e in entries if e.seq > row.position]
                end = last
                newer = first_newer(p, todo)
                if newer is not None:
                    # Skipping the event would lose it; waiting must not stop the projections
                    # that never read it. The next leader (a newer release, or this one after
                    # a restart) starts from the lowest checkpoint and meets it again.
                    held.add(p.name)
                    log.warning(
                        "projector.projection_held",
                        projection=p.name,
                        seq=newer.seq,
                        error=newer.error,
                    )
                    todo = [e for e in todo if e.seq < newer.seq]
                    end = newer.seq - 1
                if todo:
                    parked += await apply_entries(
                        conn, p, f'"{live_schema(p.name)}"', todo, self._tracker, guarded=guarded
                    )
                if end > row.position:
                    moves[p.name] = end
            # A held one stops serving, frozen at the event: left serving, every read-your-
            # writes wait stopped at its checkpoint, and its readers (the gateway's keys) took
            # its tables for current. The next leader marks it serving, to meet the event anew.
            # Those held before too: a rebuild's swap (which holds there as well) marks
            # them serving.
            await checkpoints.move(conn, moves, announce=last, held=held | self._held)
            if parked:
                # Recorded before the skip commits: a parked event is skipped for good, and
                # its record is the only trace of it. A process killed (or NATS lost) after
                # a commit and before the record would have lost the event silently; now the
                # batch rolls back and parks it again (a kill after the record and before
                # the commit leaves two records of it, never none).
                try:
                    await record_parked(
                        self._store,
                        parked,
                        consumer=self._durable,
                        attempts=self._tracker.max_attempts,
                        strict=True,
                    )
                except Exception as exc:
                    raise RetryBatchError("could not record the parked events") from exc
        self._held |= held  # only once committed: a batch rolled back holds nothing
        await self._rebuilt_elsewhere(conn, foreign)
        return parked
