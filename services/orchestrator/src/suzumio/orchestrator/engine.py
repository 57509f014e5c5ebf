"""The orchestrator at work: every requested activation is planned, launched on its backend,
watched to its end and given exactly one terminal event (DESIGN.md §8).

Like the scheduler, every replica follows the whole log and one leads (a Postgres advisory
lock): only the leader launches. When it starts leading it reconciles: each activation the log
says is not over is matched with what the backends still run — watched again if its sandbox
lives (stopped first if a cancel was asked meanwhile; under its wall-clock limit counted from
its start in the log), ended as its recorded output says or failed as lost if it was started
and its sandbox is gone, launched if it never was — and every sandbox of the platform no live
activation owns is stopped if it still runs and left to its backend's cleanup policy, with how
its activation ended. A backend that cannot list its sandboxes is asked again until it can; its
activations are left as they are meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from nats.aio.client import Client as NATS
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, StatusCode

from suzumio.contracts.envelope import (
    EVENT_TYPES,
    DomainEvent,
    EventEnvelope,
    EventMeta,
    decode_data,
)
from suzumio.contracts.errors import CommandTimeoutError, ConflictError
from suzumio.contracts.events import (
    ActivationCancelled,
    ActivationCancelRequested,
    ActivationCompleted,
    ActivationFailed,
    ActivationOutputRecorded,
    ActivationRequested,
    ActivationStarted,
    ActivationTimedOut,
    SessionClosed,
    SessionReopened,
)
from suzumio.contracts.events.activation import TERMINAL_ACTIVATION_EVENTS
from suzumio.contracts.subjects import Topology
from suzumio.orchestrator import metrics, retention, tracing
from suzumio.orchestrator.artifacts import ArtifactCollector, Collection
from suzumio.orchestrator.backends.base import Backend, Exit, Handle, LaunchError, LaunchPlan
from suzumio.orchestrator.directory import Agent, Directory, Project
from suzumio.orchestrator.planning import PlanError, Planner
from suzumio.orchestrator.resumption import (
    RELIST_FIRST_SECONDS,
    RELIST_MAX_SECONDS,
    deadline_of,
    exit_after_output,
    exit_of_gone,
    list_live,
)
from suzumio.platform.bus.direct_get import DirectGetError, last_for_subject
from suzumio.platform.bus.eventstore import (
    AggregateStream,
    ConcurrencyConflictError,
    EventStore,
    envelopes_of,
)
from suzumio.platform.bus.follower import LogMessage
from suzumio.platform.bus.trouble import NATS_TROUBLE
from suzumio.platform.errors import JetStreamApiError
from suzumio.platform.logging import get_logger
from suzumio.platform.replica import Replica
from suzumio.platform.telemetry import SECONDS_BUCKETS, meter, tracer

log = get_logger(__name__)
ACTOR = "system:orchestrator"
ACTIVATION_EVENTS = frozenset(
    {
        ActivationRequested.event_type,
        ActivationCancelRequested.event_type,
        ActivationStarted.event_type,
        ActivationOutputRecorded.event_type,
        *TERMINAL_ACTIVATION_EVENTS,
    }
)
WANTED = ACTIVATION_EVENTS | Directory.EVENT_TYPES
KEEP_ENDED = 10_000  # ended activations remembered (timings, late duplicates)
# The leader's housekeeping round: retention (workspaces, stray chunks) and the sandboxes no
# live activation owns.
SWEEP_SECONDS = 600.0
# A sandbox stopped at its timeout gets this long to report its end (a pool worker: its kill
# grace, then storing what the activation left in out/).
STOP_GRACE_SECONDS = 60.0
# A P0's activation waits this long at most for the one it replaces to end (a stop's grace:
# docker's 5 s, the process backend's 3 s).
REPLACED_WAIT_SECONDS = 10.0
# A store that fails (a timeout, a stream electing its leader) is asked again after these
# waits, doubling, for as long as this replica leads: an activation's end is never given up.
RETRY_FIRST_SECONDS = 0.2
STARTED_ATTEMPTS = 6  # a start that cannot be recorded is tried again over ~6 s, then left out
RETRY_MAX_SECONDS = 10.0
# A recovery that failed is tried again after these waits, doubling (`_recover`).
RECOVER_FIRST_SECONDS = 1.0
RECOVER_MAX_SECONDS = 60.0
# A cancel is sent again after these waits, doubling, until the activation's end is seen: one
# that failed, or that its sandbox missed (a pool worker reconnecting), must not leave it to run
# to its wall-clock limit.
RECANCEL_FIRST_SECONDS = 2.0
RECANCEL_MAX_SECONDS = 60.0
CONFLICTS_BEFORE_WAITING = 5  # appends of the end that lost to another write, in a row
COMPLETING_EXITS = frozenset({0, 3, 4})  # completed, waiting, budget exhausted
PERMANENT_EXITS = {
    2: "the runner refused its input",
    6: "the broker refused the token",
    11: "the model refused it for good (content policy, credentials, no such model)",
}

# The terminal event, from the output the activation recorded (if it did), as read or folded.
Decide = Callable[[ActivationOutputRecorded | None], DomainEvent]
# The store in trouble — NATS slow, restarting or unreachable, a stream electing its leader —
# passes; anything else (an event too large for the bus, a newer release's event on the
# subject) would fail the same way every time, and is not asked again.
_TROUBLE = (OSError, CommandTimeoutError, *NATS_TROUBLE)


class _Doubling:
    """Waits between tries: `first` seconds, doubling up to `most`."""

    def __init__(self, first: float, most: float) -> None:
        self.delay, self._most = first, most

    async def wait(self) -> None:
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, self._most)


class _EndRefusedError(Exception):
    """The store refused an activation's terminal event itself (invalid: it would refuse it
    each time it is asked). Its cause is the refusal."""


def _readable(msg: LogMessage) -> list[EventEnvelope] | None:
    """The message's events; None (said in the log) if it is no commit of events at all —
    one such message must not stop the fold, and with it the orchestrator, for good: each
    restart would replay the log up to it and stop there again."""
    try:
        return envelopes_of(msg.data)
    except Exception:
        log.exception("orchestrator.unreadable", seq=msg.seq, subject=msg.subject)
        return None


def _trouble(exc: BaseException) -> bool:
    return (
        isinstance(exc, _TROUBLE)
        or (isinstance(exc, JetStreamApiError) and exc.code >= 500)
        or (isinstance(exc, DirectGetError) and exc.passes)
    )


_outcomes = meter.create_counter("suzumio_activations", description="activations by outcome")
_launch = meter.create_histogram(
    "suzumio_activation_launch_seconds",
    unit="s",
    description="activation requested (folded) to sandbox started, by backend",
    explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
)


@dataclass
class Tracked:
    session_id: str
    request: ActivationRequested
    agent: Agent | None = None  # as the log had them when the request was stored
    project: Project | None = None
    started: bool = False
    backend: str | None = None  # where it started, and when (the log's time)
    started_at: datetime | None = None
    cancel_reason: str | None = None
    ended: bool = False
    completed: bool = False  # it ended as completed (its sandbox's cleanup policy goes by it)
    handle: Handle | None = None
    timed_out: bool = False
    timeout_seconds: float = 0.0
    launching_at: float = 0.0  # wall clock: the plan is ready and the backend is called
    launched_at: float = 0.0  # the backend says the sandbox is started
    requested_at: datetime | None = None  # the log's time of the request
    request_seq: int = 0  # the message that stored it (its trace context, `tracing`)
    # Its own subject as folded: the version of the last message whose events were all read
    # (-1: one could not be, and the subject must be read instead), and the output recorded.
    version: int = 0
    output: ActivationOutputRecorded | None = None
    ending_seen: asyncio.Event = field(default_factory=asyncio.Event)  # set as `ended` is


@dataclass(frozen=True)
class _Seen:
    """An activation's subject as far as its end is concerned: read, or as folded."""

    version: int
    output: ActivationOutputRecorded | None
    ended: DomainEvent | None = None
    folded: bool = False

    @classmethod
    def read(cls, stream: AggregateStream) -> _Seen:
        output = next(
            (e.data for e in stream.events if isinstance(e.data, ActivationOutputRecorded)), None
        )
        ended = next(
            (e.data for e in stream.events if e.envelope.type in TERMINAL_ACTIVATION_EVENTS),
            None,
        )
        return cls(stream.version, output, ended)


class Orchestrator:
    def __init__(
        self,
        nc: NATS,
        topology: Topology,
        store: EventStore,
        database_url: str,
        planner: Planner,
        backends: Mapping[str, Backend],
        artifacts: ArtifactCollector,
        retention_hours: float,
    ) -> None:
        self._nc = nc
        self._topology = topology
        self._store = store
        self._planner = planner
        self.backends = dict(backends)
        self._artifacts = artifacts
        self._retention = retention_hours * 3600
        self.replica = Replica(nc, topology, database_url, "orchestrator")
        self.directory = Directory()
        self.activations: dict[str, Tracked] = {}
        self._ended: deque[str] = deque()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._waiting_to_recover: set[str] = set()  # their tasks wait to try a recovery again
        self._cancels: dict[str, asyncio.Task[None]] = {}  # cancels sent until the end is seen
        # Activations being ended without a sandbox of theirs known (a cancel before a new
        # leader's listing came back), and the orphan the listing then found of each: cleared
        # once the end is in, which decides its cleanup.
        self._ending: set[str] = set()
        self._orphaned: dict[str, Handle] = {}
        # Backends that could not list their sandboxes since this replica began to lead: the
        # activations on them have no handle, and are matched once the backend answers.
        self._unlisted: set[str] = set()
        self.folded = self.replica.folded
        self.leading = False
        self.health_report: list[dict[str, object]] = []  # the backends', as last asked
        self._activation_prefix = topology.event_subject("activation", "")
        self._session_prefix = topology.event_subject("session", "")

    # -- following the log -------------------------------------------------------------------
    @property
    def caught_up(self) -> bool:
        return self.replica.caught_up

    async def run(self, stop: asyncio.Event) -> None:
        await self.replica.run(stop, self._fold_loop, self._lead)

    async def _fold_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            msg = await self.replica.follower.next(timeout=0.5)
            position = self.folded.value
            while msg is not None:
                envelopes: list[EventEnvelope] | None = None
                if msg.subject.startswith(self._session_prefix):
                    # First: a request's snapshot is taken before its plan can ask for it.
                    envelopes = self._observe_session(msg)
                whole = True
                if WANTED.intersection(msg.types):
                    if envelopes is None:
                        envelopes = _readable(msg)
                    whole = envelopes is not None and self._fold(msg.seq, envelopes)
                if msg.subject.startswith(self._activation_prefix):
                    self._fold_version(msg, whole)
                position = msg.seq
                msg = self.replica.follower.next_nowait()
            await self.folded.advance(position)

    def _fold_version(self, msg: LogMessage, whole: bool) -> None:
        """An activation's message folded: its version, for its end (and the store's head of
        its subject, so appending the end needs no lookup). A message with an event this
        release does not know (a newer release's, perhaps a new way to end) leaves the fold
        unable to stand for the subject, as one it could not decode does."""
        activation_id = msg.subject[len(self._activation_prefix) :]
        tracked = self.activations.get(activation_id)
        if tracked is None or tracked.version < 0:
            return
        known = bool(msg.types) and all(t in EVENT_TYPES for t in msg.types)
        if not whole or not known or msg.version <= 0:
            tracked.version = -1  # the fold no longer stands for its subject: it is read
            return
        tracked.version = msg.version
        self._store.observe("activation", activation_id, msg.version, msg.seq)

    def _observe_session(self, msg: LogMessage) -> list[EventEnvelope] | None:
        """The session's message to the planner's kept fold of it; its envelopes, if read."""
        if not self._planner.keeps(msg.subject[len(self._session_prefix) :]):
            return None
        try:
            envelopes = envelopes_of(msg.data)
        except Exception:
            return None  # `_fold` says what it cannot read
        self._planner.observe(msg.subject[len(self._session_prefix) :], msg.seq, envelopes)
        return envelopes

    def _fold(self, seq: int, envelopes: list[EventEnvelope]) -> bool:
        """Fold a message's events; whether every one it had for us could be read."""
        whole = True
        for envelope in envelopes:
            if envelope.type not in WANTED:
                continue
            try:
                event = decode_data(envelope)
            except Exception:  # a newer release's schema: not ours to guess
                log.warning("orchestrator.undecodable", seq=seq, type=envelope.type)
                whole = False
                continue
            if envelope.type in ACTIVATION_EVENTS:
                self._apply(envelope.aggregate_id, event, envelope.occurred_at, seq)
            else:
                self.directory.apply(envelope.aggregate_id, event)
        return whole

    def _apply(
        self, aggregate_id: str, data: DomainEvent, at: datetime | None = None, seq: int = 0
    ) -> None:
        match data:
            case ActivationRequested():
                agent = self.directory.agent(data.agent_id)
                project = self.directory.project(agent.project_id) if agent else None
                self.activations[data.activation_id] = Tracked(
                    aggregate_id, data, agent, project, requested_at=at, request_seq=seq
                )
                if self.leading:
                    self._begin(data.activation_id)
            case ActivationCancelRequested():
                tracked = self.activations.get(data.activation_id)
                if tracked is not None and not tracked.ended:
                    tracked.cancel_reason = data.reason or "cancel requested"
                    if self.leading:
                        self._spawn_cancel(data.activation_id)
            case _:  # on the activation's own subject
                if (t := self.activations.get(aggregate_id)) is not None:
                    self._apply_own(aggregate_id, t, data, at)

    def _apply_own(
        self, activation_id: str, t: Tracked, data: DomainEvent, at: datetime | None
    ) -> None:
        match data:
            case ActivationStarted():
                t.started, t.backend, t.started_at = True, data.backend, at
            case ActivationOutputRecorded():
                t.output = t.output or data  # the first is the one (the broker records one)
            case _:  # a terminal event
                t.ended, t.output = True, None
                t.ending_seen.set()
                t.completed = isinstance(data, ActivationCompleted)
                self._planner.forget(activation_id)
                self._ended.append(activation_id)
                while len(self._ended) > KEEP_ENDED:  # memory stays bounded
                    self.activations.pop(self._ended.popleft(), None)

    # -- leading -----------------------------------------------------------------------------
    async def _lead(self, done: asyncio.Event) -> None:
        if not await self.folded.caught_up(self._nc, self._topology, done):
            return
        self.leading = True
        log.info("orchestrator.leading", position=self.folded.value)
        gc = asyncio.create_task(self._gc_loop(done))
        try:
            await self._reconcile(done)
            await done.wait()
        finally:
            self.leading = False
            gc.cancel()
            running = [*self._tasks.values(), *self._cancels.values()]
            for task in running:
                task.cancel()  # a new leader takes over the watching; sandboxes live on
            try:
                await asyncio.gather(*running, return_exceptions=True)
            finally:  # cancelled meanwhile (the term's end overdue): it steps down all the same
                self._end_term()
                for backend in self.backends.values():
                    try:
                        await backend.release()
                    except Exception as exc:  # a backend's fault must not stop the stepping down
                        log.warning("orchestrator.release_failed", backend=backend.name,
                                    error=repr(exc))  # fmt: skip

    def _end_term(self) -> None:
        """What a term knew that the next must find again for itself."""
        self._tasks.clear()
        self._waiting_to_recover.clear()
        self._cancels.clear()
        self._ending.clear()  # (an end cancelled before it began never took itself out)
        self._orphaned.clear()
        self._unlisted = set()
        for tracked in self.activations.values():
            if not tracked.ended:
                # What this term knew of its sandbox is the next term's to find again: a
                # handle kept across a term that matched nothing (its backend silent) had a
                # cancel stop that sandbox for ever, never the activation ended.
                tracked.handle, tracked.timed_out = None, False

    async def _reconcile(self, done: asyncio.Event) -> None:
        """Match the log's unfinished activations with what the backends have. A backend
        that cannot list (its engine or API briefly unreachable) is asked again, with
        backoff, while this replica leads: until it answers, its activations stay as the log
        has them — their sandboxes may well run — neither lost nor launched a second time."""
        pending: set[str] = set(self.backends)
        delay = RELIST_FIRST_SECONDS
        found_at = time.time()
        while pending and not done.is_set():
            live, unlisted = await list_live(self.backends, pending)
            self._unlisted = unlisted
            await self._match(live, unlisted)
            self._end_overdue(unlisted, found_at)
            pending = unlisted
            if pending:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), delay)
                delay = min(delay * 2, RELIST_MAX_SECONDS)

    async def _match(self, live: dict[str, Handle], unlisted: set[str]) -> None:
        for activation_id, tracked in list(self.activations.items()):
            if tracked.ended or activation_id in self._tasks:
                continue  # over, or requested while we looked and being launched already
            if self._backend_of(tracked) in unlisted:
                continue  # matched when its backend answers
            handle = live.pop(activation_id) if activation_id in live else None
            if handle is not None:
                tracked.handle = handle
                self._tasks[activation_id] = asyncio.create_task(self._resume(tracked, handle))
            else:  # each on its own: one whose log cannot be read holds up no other
                self._tasks[activation_id] = asyncio.create_task(self._recover(tracked))
        for handle in live.values():  # sandboxes no live activation owns: orphans
            if handle.ended:
                continue  # over, with nothing left of it
            if handle.activation_id in self._ending:
                self._orphaned[handle.activation_id] = handle  # cleared after its end
            elif handle.activation_id not in self._tasks:  # else being launched
                await self._clear_orphan(handle)

    def _end_overdue(self, unlisted: set[str], found_at: float) -> None:
        """The activations of backends that still cannot list, past their wall clock (and
        the grace a stop gets): ended as timed out now, not left running for as long as the
        backend stays silent — maybe for ever. Their tokens are revoked with the end; a
        sandbox of theirs the backend shows later is cleared as an orphan."""
        for activation_id, tracked in list(self.activations.items()):
            if tracked.ended or activation_id in self._tasks:
                continue
            if self._backend_of(tracked) not in unlisted:
                continue
            limit = self._wall_clock(tracked)
            deadline = deadline_of(tracked.started_at, limit, found_at)
            if limit is None or deadline is None or time.time() < deadline + STOP_GRACE_SECONDS:
                continue
            log.warning("orchestrator.overdue_unlisted", activation=activation_id,
                        backend=self._backend_of(tracked))  # fmt: skip
            tracked.timed_out, tracked.timeout_seconds = True, limit
            timed_out = ActivationTimedOut(timeout_seconds=limit)
            self._spawn_end(tracked, self._unless_finished(tracked, timed_out))

    async def _clear_orphan(self, handle: Handle) -> None:
        """A sandbox whose activation is over (or unknown): stopped only if it still runs —
        stopping a finished Kubernetes Job deletes it — then left to its backend's cleanup
        policy with the activation's real outcome, so a sandbox kept for a person to look at
        (`never`, or `on_success` after a failure) stays kept."""
        backend = self.backends[handle.backend]
        completed = await self._completed(handle.activation_id)
        try:
            if not handle.finished:
                log.warning("orchestrator.orphan", activation=handle.activation_id,
                            backend=handle.backend)  # fmt: skip
                await backend.cancel(handle)
            await backend.cleanup(handle, succeeded=completed)
        except Exception as exc:  # the next leader finds it again
            log.warning("orchestrator.orphan_cleanup_failed", activation=handle.activation_id,
                        backend=handle.backend, error=repr(exc)[:500])  # fmt: skip

    async def _completed(self, activation_id: str) -> bool:
        """Whether the activation ended as completed: as folded, else (ended so long ago that
        it is forgotten) as its subject says. Not known counts as not completed: a policy
        that keeps failures keeps it, which is the mistake that loses nothing."""
        tracked = self.activations.get(activation_id)
        if tracked is not None:
            return tracked.completed
        try:
            stream = await self._store.load("activation", activation_id)
        except Exception as exc:
            log.warning("orchestrator.load_failed", activation=activation_id,
                        error=repr(exc)[:500])  # fmt: skip
            return False
        return isinstance(_Seen.read(stream).ended, ActivationCompleted)

    def _backend_of(self, tracked: Tracked) -> str | None:
        """Where its sandbox is, or would be: the backend it started on, else its profile's
        (one launched just before a restart may have a sandbox but no start in the log)."""
        if tracked.backend is not None or tracked.agent is None or tracked.project is None:
            return tracked.backend
        try:
            return self._planner.profile(tracked.agent, tracked.project).backend.value
        except PlanError:
            return None  # its plan fails at once: nothing of it can run anywhere

    async def _recover(self, tracked: Tracked, pause: _Doubling | None = None) -> None:
        """An activation without a sandbox when this replica took the lead: launched if it
        never was. One the log says started — or whose runner wrote to the log, though its
        start was never appended (the leader crashed in between) — ran, and its sandbox is
        gone: it ends as its recorded output says (its runner had finished), else as lost;
        what it left in out/ is still collected. It is not launched a second time.

        A recovery that fails for more than passing trouble (which `_load` waits out) — an
        event of a newer release in its story, a fault of this code — is tried again, after
        `pause` (doubling up to `RECOVER_MAX_SECONDS`), for as long as this replica leads: it
        was left `running` until the next leader, and its session, which runs one activation
        at a time, with it."""
        activation_id = tracked.request.activation_id
        failed = False
        try:
            stream = await self._load(activation_id)
            if not tracked.started and not stream.events:
                await self._run(tracked)
                return
            exit_ = exit_of_gone(stream)
            backend = tracked.backend or self._backend_of(tracked)
            if exit_.code is not None and backend is not None:
                await self._collect(self._found_again(tracked, backend), exit_)
            await self._end(tracked, lambda o: self._terminal(tracked, exit_, o), stream)
        except asyncio.CancelledError:
            raise
        except Exception:
            pause = pause or _Doubling(RECOVER_FIRST_SECONDS, RECOVER_MAX_SECONDS)
            log.exception("orchestrator.recover_error", activation=activation_id,
                          retry_in=pause.delay)  # fmt: skip
            failed = True
        finally:
            self._tasks.pop(activation_id, None)
        if failed and pause is not None and not tracked.ended:
            self._tasks[activation_id] = asyncio.create_task(self._recover_after(tracked, pause))
            self._waiting_to_recover.add(activation_id)  # a cancel meanwhile goes its own way

    async def _recover_after(self, tracked: Tracked, pause: _Doubling) -> None:
        activation_id = tracked.request.activation_id
        try:
            await pause.wait()
        finally:
            self._waiting_to_recover.discard(activation_id)
        if tracked.ended or not self.leading:  # ended meanwhile (a cancel, its output folded)
            if self._tasks.get(activation_id) is asyncio.current_task():
                del self._tasks[activation_id]
            return
        await self._recover(tracked, pause)

    def _begin(self, activation_id: str) -> None:
        tracked = self.activations[activation_id]
        if tracked.ended or activation_id in self._tasks:
            return
        self._tasks[activation_id] = asyncio.create_task(self._run(tracked))

    def _spawn_cancel(self, activation_id: str) -> None:
        tracked = self.activations[activation_id]
        task = self._tasks.get(activation_id)
        unlisted = tracked.handle is None and self._backend_of(tracked) in self._unlisted
        ends_here = not tracked.started or unlisted
        if task is not None and activation_id in self._waiting_to_recover and ends_here:
            # A recovery that failed, waiting to be tried again, handles nothing meanwhile:
            # the cancel is carried out as if it were not there (else, the failure being one
            # that repeats, never while this replica leads). One of a started activation
            # waits on: its end is the recovery's.
            task.cancel()
            del self._tasks[activation_id]
            self._waiting_to_recover.discard(activation_id)  # (a task cancelled unstarted)
            task = None
        if task is None and ends_here:
            # Not started as the log has it, yet its runner may have run (launched just before
            # a leader went, its start never appended) and finished: its output decides. Or
            # started, its backend unable to list its sandboxes since this replica began to
            # lead: ended now all the same (its token is revoked with the request), not when
            # the backend answers — maybe never; a sandbox it shows then is an orphan, stopped.
            cancelled = ActivationCancelled(reason=tracked.cancel_reason or "")
            self._spawn_end(tracked, self._unless_finished(tracked, cancelled))
        elif tracked.handle is not None:
            self._keep_cancelling(tracked, tracked.handle)

    def _keep_cancelling(self, tracked: Tracked, handle: Handle) -> None:
        """Stop its sandbox — and again, now and then, until its end is seen (watch() ends
        it)."""
        activation_id = tracked.request.activation_id
        if activation_id in self._cancels:
            return
        task = asyncio.create_task(self._cancel_until_ended(tracked, handle))
        self._cancels[activation_id] = task

        def forget(done: asyncio.Task[None]) -> None:
            if self._cancels.get(activation_id) is done:
                del self._cancels[activation_id]

        task.add_done_callback(forget)

    async def _cancel_until_ended(self, tracked: Tracked, handle: Handle) -> None:
        backend = self.backends[handle.backend]
        pause = _Doubling(RECANCEL_FIRST_SECONDS, RECANCEL_MAX_SECONDS)
        while not tracked.ended:
            try:
                await backend.cancel(handle)
            except Exception as exc:
                log.warning("orchestrator.cancel_failed", activation=handle.activation_id,
                            error=repr(exc)[:500])  # fmt: skip
            await pause.wait()

    # -- one activation ------------------------------------------------------------------------
    async def _run(self, tracked: Tracked) -> None:
        activation_id = tracked.request.activation_id
        folded_at = time.perf_counter()
        began = time.time_ns()
        try:
            try:
                plan = await self._planner.plan(
                    tracked.session_id,
                    tracked.request,
                    tracked.agent,
                    tracked.project,
                    tracked.request_seq,
                )
            except PlanError as exc:
                await self._end(tracked, ActivationFailed(reason=str(exc), retryable=False))
                return
            backend = self.backends.get(plan.profile.backend.value)
            if backend is None:
                reason = f"backend {plan.profile.backend.value!r} is not enabled here"
                await self._end(tracked, ActivationFailed(reason=reason, retryable=False))
                return
            files = self.directory.session_files(plan.session_id)
            plan = await self._artifacts.copy_in(plan, files)
            await self._replaced_gone(tracked)
            if tracked.cancel_reason is not None:
                await self._end(tracked, ActivationCancelled(reason=tracked.cancel_reason))
                return
            handle = await self._launch(tracked, plan, backend, folded_at, began)
            if handle is None:
                return
            tracked.started = True
            if _cancelling(tracked):  # asked while it was being launched
                self._keep_cancelling(tracked, handle)
            await self._watch(tracked, handle, plan)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("orchestrator.activation_error", activation=activation_id)
            await self._fail_or_log(tracked, exc)
        finally:
            self._tasks.pop(activation_id, None)

    async def _replaced_gone(self, tracked: Tracked) -> None:
        """A P0's activation starts once the one it replaces has ended (DESIGN §6: cancel,
        then start) — else both ran side by side on the session's directory for the stop's
        grace, the old one's last commands changing files the new one reads — or, its sandbox
        slow to stop, after `REPLACED_WAIT_SECONDS` all the same (it is fenced already)."""
        replaced = tracked.request.replaces
        old = self.activations.get(replaced) if replaced else None
        if old is None or old.ended or not (old.started or replaced in self._tasks):
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(old.ending_seen.wait(), REPLACED_WAIT_SECONDS)
        if not old.ended:
            log.warning("orchestrator.replaced_still_running", activation=replaced,
                        replacement=tracked.request.activation_id)  # fmt: skip

    async def _launch(
        self, tracked: Tracked, plan: LaunchPlan, backend: Backend, folded_at: float, began: int
    ) -> Handle | None:
        """The sandbox started and its start appended, in the launch's span (`began`: when
        the activation's turn came, ns); None if the backend could not start it (it is ended
        as failed then)."""
        span = await self._launch_span(tracked, plan, backend.name, began)
        # The runner continues the launch's trace: its calls to the broker carry it.
        plan = dataclasses.replace(plan, env={**plan.env, **tracing.traceparent(span)})
        refused: LaunchError | None = None
        # Current while the start is appended, so its message carries the launch's context.
        with trace.use_span(span, end_on_exit=True):
            tracked.launching_at = time.time()  # control plane done: the sandbox's turn
            if (queued := metrics.since(tracked.requested_at, tracked.launching_at)) is not None:
                metrics.stage("queued", queued)
            try:
                handle = await backend.launch(plan)
            except LaunchError as exc:
                span.set_status(StatusCode.ERROR, f"launch: {exc}"[:500])
                refused = exc
            else:
                tracked.handle = handle
                tracked.launched_at = time.time()
                metrics.stage("launching", tracked.launched_at - tracked.launching_at)
                _launch.record(time.perf_counter() - folded_at, {"backend": backend.name})
                span.set_attribute("suzumio.sandbox", handle.sandbox_id)
                await self._append_started(
                    plan.activation_id,
                    ActivationStarted(
                        session_id=tracked.session_id,
                        project_id=plan.project_id,
                        agent_id=plan.agent_id,
                        backend=backend.name,
                        sandbox_id=handle.sandbox_id,
                    ),
                )
                return handle
        assert refused is not None
        reason = f"launch: {refused}"
        await self._end(tracked, ActivationFailed(reason=reason, retryable=refused.retryable))
        return None

    async def _launch_span(
        self, tracked: Tracked, plan: LaunchPlan, backend: str, began: int
    ) -> Span:
        """The launch's span, from `began` (ns): a child of the trace of what asked for the
        activation, when the log's messages tell it (`tracing.origin`), else a trace of its
        own."""
        parent, links = await tracing.origin(
            self._nc,
            self._topology.events_stream,
            self._topology.event_subject("session", tracked.session_id),
            (tracked.request_seq, *plan.origins),
        )
        return tracer.start_span(
            "activation.launch",
            context=parent or Context(),
            kind=SpanKind.INTERNAL,
            links=links,
            start_time=began,
            attributes={
                "suzumio.activation": plan.activation_id,
                "suzumio.session": plan.session_id,
                "suzumio.agent": plan.agent_id,
                "suzumio.attempt": plan.attempt,
                "suzumio.backend": backend,
            },
        )

    async def _resume(self, tracked: Tracked, handle: Handle) -> None:
        try:
            if _cancelling(tracked):  # asked while no replica led, or while we listed
                self._keep_cancelling(tracked, handle)
            await self._watch(tracked, handle, None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("orchestrator.resume_error", activation=handle.activation_id)
            await self._fail_or_log(tracked, exc)
        finally:
            self._tasks.pop(handle.activation_id, None)

    async def _fail_or_log(self, tracked: Tracked, exc: Exception) -> None:
        try:
            await self._fail(tracked, exc)
        except asyncio.CancelledError:
            raise
        except Exception:  # its log cannot be read (a newer release's event): it waits for one
            log.exception("orchestrator.end_failed", activation=tracked.request.activation_id)

    async def _fail(self, tracked: Tracked, exc: Exception) -> None:
        """An error of ours: its sandbox, if it has one, is stopped — asked again until the
        backend says it is, for as long as this replica leads: the failure ends the attempt,
        and a retry must not meet it still at work — and it ends as failed, unless its runner
        had recorded its output (then as that output says). The sandbox is then left to its
        cleanup policy with that outcome."""
        handle = tracked.handle
        if handle is not None:
            backend = self.backends[handle.backend]
            pause = _Doubling(RECANCEL_FIRST_SECONDS, RECANCEL_MAX_SECONDS)
            while True:
                try:
                    await backend.cancel(handle)
                    break
                except Exception as err:
                    log.warning("orchestrator.stop_failed", activation=handle.activation_id,
                                error=repr(err)[:500], retry_in=pause.delay)  # fmt: skip
                await pause.wait()
        refused = isinstance(exc, _EndRefusedError) and exc.__cause__ is not None
        failed = ActivationFailed(
            reason=f"orchestrator: {exc.__cause__ if refused else exc!r}"[:2_000]
        )
        try:
            # An end the store refused is not asked for again: it would be refused again.
            ended = await self._end(
                tracked, failed if refused else self._unless_finished(tracked, failed)
            )
        except Exception:
            # No end could be stored: the sandbox is stopped, and nothing else would remove
            # it while this replica leads (left to the policy as failed). Not when cancelled:
            # a replica that stops leading leaves the sandbox to the next leader.
            await self._clean_up(handle, None)
            raise
        await self._clean_up(handle, ended)

    async def _clean_up(self, handle: Handle | None, ended: DomainEvent | None) -> None:
        """The sandbox left to its cleanup policy by how it ended (`ended`: None, no end
        stored). A cleanup that fails is logged: the orphan sweep meets the sandbox again."""
        if handle is None:
            return
        try:
            await self.backends[handle.backend].cleanup(
                handle, succeeded=isinstance(ended, ActivationCompleted)
            )
        except Exception as err:
            log.warning("orchestrator.cleanup_failed", activation=handle.activation_id,
                        error=repr(err)[:500])  # fmt: skip

    async def _watch(self, tracked: Tracked, handle: Handle, plan: LaunchPlan | None) -> None:
        backend = self.backends[handle.backend]
        timeout = self._remaining(tracked, plan)
        try:
            exit_ = await asyncio.wait_for(backend.watch(handle), timeout)
        except TimeoutError:
            tracked.timed_out = True
            # Stopped as a cancel is, asked again until its end is seen: a stop that fails (an
            # engine briefly unreachable) leaves it a timeout, not an error of ours.
            self._keep_cancelling(tracked, handle)
            try:
                exit_ = await asyncio.wait_for(backend.watch(handle), STOP_GRACE_SECONDS)
            except TimeoutError:  # still a timeout, not an error of ours: it ends as one
                detail = f"it did not report its end within {STOP_GRACE_SECONDS:.0f} s of a stop"
                exit_ = Exit(None, "timeout", detail)
        target = Collection.of(plan) if plan else self._found_again(tracked, handle.backend)
        await self._collect(target, exit_)
        terminal = await self._end(tracked, lambda output: self._terminal(tracked, exit_, output))
        # Ended: a cleanup that fails now is no failure of the activation's — taken for one, it
        # stopped (deleted) the finished sandbox its policy keeps. The orphan sweep tries again.
        await self._clean_up(handle, terminal)

    def _mark_ended(self, activation_id: str) -> None:
        """Retention counts from an activation's end, and the sweep reads it off its
        directory's time, which is its launch's until now: a kept directory of a long
        activation would otherwise go as soon as it ended."""
        path = self._planner.settings.activation_dir(activation_id)
        with contextlib.suppress(OSError):
            os.utime(path, follow_symlinks=False)

    async def _collect(self, target: Collection | None, exit_: Exit) -> None:
        if target is None:
            return
        try:
            await self._artifacts.collect(target, exit_)
        except Exception:  # the files are the activation's, not its outcome: it still ends
            # as it did (a failure here would have its work done again)
            log.exception("orchestrator.collect_failed", activation=target.activation_id)

    def _found_again(self, tracked: Tracked, backend: str) -> Collection | None:
        """Where the files of an activation launched before a restart are: its directory is
        where every plan puts it; its project, what the log said when it was requested."""
        project_id = tracked.project.id if tracked.project else tracked.request.project_id
        if not project_id:
            return None
        activation_id = tracked.request.activation_id
        host_dir = self._planner.settings.activation_dir(activation_id)
        return Collection(project_id, tracked.session_id, activation_id, backend, host_dir)

    def _remaining(self, tracked: Tracked, plan: LaunchPlan | None) -> float | None:
        if plan is not None and plan.deadline is not None:
            tracked.timeout_seconds = float(plan.profile.timeouts.wall_clock_seconds)
            return max((plan.deadline - datetime.now(UTC)).total_seconds(), 1.0)
        # Found again after a restart: the plan is gone, its limit is not (the profile as the
        # log had it at the request); the deadline is the handle's if it keeps one (the pool),
        # else counted from the start in the log.
        limit = self._wall_clock(tracked)
        tracked.timeout_seconds = limit or 0.0
        deadline = tracked.handle.data.get("deadline") if tracked.handle else None
        if not isinstance(deadline, (int, float)):
            deadline = deadline_of(tracked.started_at, limit, time.time())
        if deadline is None:
            return None  # no limit on record: the broker's token expiry fences it
        return max(deadline - time.time(), 1.0)

    def _wall_clock(self, tracked: Tracked) -> float | None:
        if tracked.agent is None or tracked.project is None:
            return None
        try:
            profile = self._planner.profile(tracked.agent, tracked.project)
        except PlanError:
            return None
        return float(profile.timeouts.wall_clock_seconds)

    @staticmethod
    def _terminal(  # noqa: PLR0911
        tracked: Tracked, exit_: Exit, output: ActivationOutputRecorded | None
    ) -> DomainEvent:
        if exit_.code is None and output is not None and (exit_.gone or not tracked.timed_out):
            # Its exit code is lost (a Job deleted by a cancel or the stop at its time limit
            # just after the runner finished; a pool worker's drain killing a runner still
            # reporting, or reaping its commands): it had recorded its output, so it exits as
            # a runner does after that — its work done, not to be done again. (One our stop
            # at its time limit killed, still there, timed out.)
            exit_ = exit_after_output(output, exit_.detail)
        if exit_.code in COMPLETING_EXITS and output is not None:
            # Finished, even if a cancel or the wall-clock stop came after (the runner was on
            # its way out, or a pool worker still storing its out/): its work is done, and a
            # timeout would have the scheduler do it all again.
            return ActivationCompleted(
                text=output.text, usage=output.usage, reason=output.reason, exit_code=exit_.code
            )
        if tracked.timed_out or exit_.reason == "timeout":  # ours, or the backend's own
            return ActivationTimedOut(timeout_seconds=tracked.timeout_seconds, exit_code=exit_.code)
        if tracked.cancel_reason is not None:
            return ActivationCancelled(reason=tracked.cancel_reason, exit_code=exit_.code)
        if exit_.code in PERMANENT_EXITS:
            reason = PERMANENT_EXITS[exit_.code]
            if output is not None:  # what the runner said of it (the provider's words)
                reason = f"{reason}: {output.text[:500]}"
            return ActivationFailed(reason=reason, exit_code=exit_.code, retryable=False)
        if exit_.reason == "oom":
            return ActivationFailed(reason="out of memory", exit_code=exit_.code, retryable=False)
        if exit_.code is None:
            reason = f"{exit_.reason}: {exit_.detail}".strip(": ")
            return ActivationFailed(reason=reason, retryable=exit_.retryable is not False)
        detail = output.text[:500] if output is not None else "no output"
        return ActivationFailed(reason=f"runner exit {exit_.code}: {detail}", exit_code=exit_.code)

    def _unless_finished(self, tracked: Tracked, event: DomainEvent) -> Decide:
        """`event`, unless the runner recorded its output: then it had finished, and it ends
        as a runner exits after that output (ours failing, or a cancel that came after, must
        not have the scheduler do the work again)."""

        def decide(output: ActivationOutputRecorded | None) -> DomainEvent:
            if output is None:
                return event
            exit_ = exit_after_output(output, "its output was recorded")
            return self._terminal(tracked, exit_, output)

        return decide

    # -- the log -------------------------------------------------------------------------------
    async def _end(
        self,
        tracked: Tracked,
        event: DomainEvent | Decide,
        stream: AggregateStream | None = None,
    ) -> DomainEvent:
        """The activation's one terminal event, appended on the condition that none is there
        (`event`, or what `event` makes of the output the activation recorded; `stream`: the
        activation as just read, if it was). Read and appended again, for as long as this
        replica leads, when another write came first or the store fails. The terminal event
        it has.

        The first try goes by the activation's subject as folded, not read: the condition is
        its version, so a fold that missed a later event (its output, on its way) only loses
        the append, and the subject is read then."""
        decide: Decide = event if callable(event) else (lambda _: event)
        seen = _Seen.read(stream) if stream is not None else self._as_folded(tracked)
        try:
            ended = await self._append_end(tracked, decide, seen)
        except _EndRefusedError as exc:
            # Refused as invalid (too large for the bus, say): it would be each time it is
            # asked. Whatever path ends it, the activation ends failed, saying why, rather
            # than with no end at all.
            log.warning("orchestrator.end_refused", activation=tracked.request.activation_id,
                        error=repr(exc.__cause__)[:500])  # fmt: skip
            failed = ActivationFailed(reason=f"orchestrator: {exc.__cause__}"[:2_000])
            ended = await self._append_end(tracked, lambda _: failed, None)
        tracked.ended, tracked.completed = True, isinstance(ended, ActivationCompleted)
        tracked.ending_seen.set()
        self._mark_ended(tracked.request.activation_id)  # however it ended: watched or not
        return ended

    async def _append_end(
        self, tracked: Tracked, decide: Decide, seen: _Seen | None
    ) -> DomainEvent:
        """The terminal event `decide` makes of the activation's subject (`seen`: as folded or
        read, if it was), appended; or the one already there.

        Raises:
            _EndRefusedError: the store refused it (not trouble that passes).
        """
        activation_id = tracked.request.activation_id
        pause = _Doubling(RETRY_FIRST_SECONDS, RETRY_MAX_SECONDS)
        conflicts = 0
        while True:
            if seen is None:
                seen = _Seen.read(await self._load(activation_id))
            if seen.ended is not None:
                return seen.ended
            ended = decide(seen.output)
            try:
                await self._store.append(
                    activation_id, [ended], seen.version, EventMeta(actor=ACTOR)
                )
            except ConcurrencyConflictError:
                if not seen.folded:
                    conflicts += 1
                    if conflicts > CONFLICTS_BEFORE_WAITING:  # its runner still writes: let it
                        await pause.wait()
                seen = None
                continue
            except Exception as exc:  # it may be stored all the same: read before writing again
                if not _trouble(exc):
                    raise _EndRefusedError(str(exc)) from exc
                log.warning("orchestrator.end_failed", activation=activation_id,
                            error=repr(exc)[:500], retry_in=pause.delay)  # fmt: skip
                await pause.wait()
                seen = None
                continue
            _outcomes.add(1, {"outcome": ended.event_type.rsplit(".", 1)[-1]})
            metrics.ended(ended, seen.output)
            if (total := metrics.since(tracked.requested_at)) is not None:
                metrics.stage("total", total)
            return ended

    @staticmethod
    def _as_folded(tracked: Tracked) -> _Seen | None:
        """The activation's subject as folded, if the fold can stand for a read: not when an
        end was folded (which one is on the subject), nor when an event could not be read."""
        if tracked.ended or tracked.version < 0:
            return None
        return _Seen(tracked.version, tracked.output, folded=True)

    async def _load(self, activation_id: str) -> AggregateStream:
        """The activation as the log has it, asked again while the store fails."""
        pause = _Doubling(RETRY_FIRST_SECONDS, RETRY_MAX_SECONDS)
        while True:
            try:
                return await self._store.load("activation", activation_id)
            except Exception as exc:
                if not _trouble(exc):
                    raise
                log.warning("orchestrator.load_failed", activation=activation_id,
                            error=repr(exc)[:500], retry_in=pause.delay)  # fmt: skip
            await pause.wait()

    def _spawn_end(self, tracked: Tracked, event: DomainEvent | Decide) -> None:
        """`_end_and_forget` as a task of its own. The activation is `_ending` from now, not
        from when that task first runs: a listing matched in between (`_match`) must hand it
        the sandbox it found — else, being in `_tasks` yet not `_ending`, the sandbox looked
        like one being launched, and stayed, owned by no one."""
        activation_id = tracked.request.activation_id
        self._ending.add(activation_id)
        self._tasks[activation_id] = asyncio.create_task(self._end_and_forget(tracked, event))

    async def _end_and_forget(self, tracked: Tracked, event: DomainEvent | Decide) -> None:
        """The end of an activation without a known sandbox; then the sandbox a listing found
        of it meanwhile (`_match`), cleared as an orphan by that end."""
        activation_id = tracked.request.activation_id
        self._ending.add(activation_id)
        try:
            await self._end(tracked, event)
            if (orphan := self._orphaned.pop(activation_id, None)) is not None:
                await self._clear_orphan(orphan)
        finally:  # not ended (no longer leading, say): the next leader finds the sandbox
            self._ending.discard(activation_id)
            self._orphaned.pop(activation_id, None)
            self._tasks.pop(activation_id, None)

    async def _append_started(self, activation_id: str, event: ActivationStarted) -> None:
        """The sandbox is running, and its runner may have acted: trouble with NATS while this
        is recorded must not stop it (its work would be done twice). Tried again for a while
        (refused outright, not at all), then left out — the story lacks its start, and the end
        is decided as ever (the watch, the output), as after a leader that died before it
        recorded one."""
        # The activation's subject is new when it starts: nothing is there to look up, unless
        # its runner already called the broker (then the refused append says where it is).
        pause = _Doubling(RETRY_FIRST_SECONDS, RETRY_MAX_SECONDS)
        for attempt in range(1, STARTED_ATTEMPTS + 1):
            try:
                await self._store.append_next(
                    activation_id, [event], EventMeta(actor=ACTOR), likely_version=0
                )
            except ConflictError:
                log.warning("orchestrator.append_conflict", activation=activation_id)
            except Exception as exc:
                log.warning("orchestrator.started_unrecorded", activation=activation_id,
                            attempt=attempt, error=repr(exc)[:500])  # fmt: skip
                if _trouble(exc) and attempt < STARTED_ATTEMPTS:
                    await pause.wait()
                    continue
            return

    # -- housekeeping ----------------------------------------------------------------------------
    async def _gc_loop(self, done: asyncio.Event) -> None:
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), SWEEP_SECONDS)
            if done.is_set():
                return
            try:
                await self._collect_garbage(time.time() - self._retention)
            except Exception:  # the next pass tries again: the sweep never stops for good
                log.exception("orchestrator.gc_failed")
            try:
                await self._sweep_orphans()
            except Exception:
                log.exception("orchestrator.orphan_sweep_failed")

    async def _sweep_orphans(self) -> None:
        """Sandboxes still running that no live activation owns, made while this replica
        leads — a launch whose answer was lost and whose removal failed too, a stop that
        failed — stopped each round, not only at the next takeover (which may be weeks away),
        as `_match` clears those found then. Only of activations ended before the listing
        (or unknown): one listed while it still ran, ended since, is its watcher's to clean
        up — a stop from this listing, stale by then, would delete a Job its policy keeps. A
        finished sandbox (nothing runs; what is left is kept by its policy, or its cleanup
        failed) is left to the takeover: every round would go over each one kept."""
        ended = {activation_id for activation_id, t in self.activations.items() if t.ended}
        live, _ = await list_live(self.backends, set(self.backends))
        for activation_id, handle in live.items():
            if handle.ended or handle.finished:
                continue
            if activation_id in self._tasks or activation_id in self._cancels:
                continue
            if activation_id in self._ending or activation_id in self._orphaned:
                continue
            if activation_id in ended or activation_id not in self.activations:
                await self._clear_orphan(handle)

    async def _collect_garbage(self, horizon: float) -> None:
        """Remove what retention lets go of: ended activations' directories, and closed
        sessions' own (`retention`); and the chunks of puts killed half-way in the artifacts'
        store."""
        root = self._planner.settings.sandboxes()
        live = {name for name, t in self.activations.items() if not t.ended}
        sessions = {t.session_id for t in self.activations.values() if not t.ended}
        sweeps: dict[str, Callable[[], Awaitable[object]]] = {
            "activations": lambda: retention.sweep_activations(root / "activations", horizon, live),
            "sessions": lambda: retention.sweep_sessions(
                root / "sessions", horizon, sessions, self._closed_at
            ),
            "strays": lambda: self._artifacts.sweep_strays(),  # noqa: PLW0108 -- read late
        }
        for what, sweep in sweeps.items():  # each on its own: one that fails skips no other
            try:
                await sweep()
            except Exception:
                log.exception("orchestrator.gc_failed", sweep=what)

    async def _closed_at(self, session_id: str) -> float | None:
        """When the session was closed, if it is: read off its log's last event when that is
        its closing or reopening, else from the sessions read model — a closed session still
        takes its last activation's history entries, so the closing need not be last (its
        directory stayed for good when only the last event was looked at)."""
        subject = self._topology.event_subject("session", session_id)
        stored = await last_for_subject(self._nc, self._topology.events_stream, subject)
        if stored is None:
            return None
        last = envelopes_of(stored.data)[-1]
        if last.type == SessionClosed.event_type:
            return last.occurred_at.timestamp()
        if last.type == SessionReopened.event_type:
            return None
        return await self._artifacts.closed_at(session_id, stored.seq)

    async def backend_health(self) -> list[dict[str, object]]:
        report: list[dict[str, object]] = []
        for name, backend in self.backends.items():
            try:
                health = await asyncio.wait_for(backend.health(), 10)
                report.append({"name": name, "ok": health.ok, **health.detail})
            except Exception as exc:
                report.append({"name": name, "ok": False, "error": repr(exc)[:500]})
        running = sum(1 for t in self.activations.values() if t.started and not t.ended)
        for entry in report:
            entry |= {"leading": self.leading, "running_here": running if self.leading else 0}
        self.health_report = report
        return report

    async def close(self) -> None:
        for backend in self.backends.values():
            with contextlib.suppress(Exception):
                await backend.close()


def _cancelling(tracked: Tracked) -> bool:
    return tracked.cancel_reason is not None
