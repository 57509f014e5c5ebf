"""The scheduler at work: follow the log, fold it, and (when leading) turn the rules' plans into
conditional appends on the sessions' subjects.

Every replica follows the whole log from sequence 1 at start, so its state is the log's and
nothing else. One replica leads (a Postgres advisory lock) and decides; the others stand by
with the same state, ready to take over. What keeps "one live activation per session" true
even if two ever decided at once is that each decision is appended on the condition that the
session is still at the version it was decided on: the loser's append conflicts and it looks
again. State changes only by folding the log, the leader's own decisions included: a decision
in flight holds its session (and the capacity it takes) until its events come back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from nats.aio.client import Client as NATS
from opentelemetry.context import Context
from pydantic import ValidationError

from suzumio.contracts.commands import CommandAccepted, PostMessage, RecordSignal
from suzumio.contracts.envelope import DomainEvent, EventEnvelope, EventMeta, decode_data
from suzumio.contracts.errors import (
    CommandError,
    CommandTimeoutError,
    ConflictError,
    NotFoundError,
    UnavailableError,
)
from suzumio.contracts.events import (
    ActivationCancelRequested,
    ActivationRequested,
    ActivationStarted,
    SessionMessageAppended,
    SignalClosed,
    SignalRecorded,
    SignalsDelivered,
)
from suzumio.contracts.events.activation import TERMINAL_ACTIVATION_EVENTS
from suzumio.contracts.ids import derived_id, new_id
from suzumio.contracts.runner import SignalSpec
from suzumio.contracts.scheduling import (
    AgentSchedulingState,
    EndedActivationView,
    HookAction,
    PendingSignalView,
)
from suzumio.contracts.subjects import Topology
from suzumio.contracts.values import Priority, SignalKind, SignalOutcome
from suzumio.platform import telemetry, trace_origin
from suzumio.platform.bus.commands import CommandClient, CommandServer
from suzumio.platform.bus.direct_get import StoredMessage, first_after
from suzumio.platform.bus.eventstore import ConcurrencyConflictError, EventStore, envelopes_of
from suzumio.platform.bus.follower import LogMessage
from suzumio.platform.bus.jsapi import stream_last_seq
from suzumio.platform.logging import get_logger
from suzumio.platform.replica import Replica
from suzumio.platform.telemetry import meter
from suzumio.scheduler.domain import policy
from suzumio.scheduler.domain.admission import Admission
from suzumio.scheduler.domain.model import Ended, SessionSchedule, Signal
from suzumio.scheduler.domain.policy import MAX_CLOSES_PER_DECISION, Plan
from suzumio.scheduler.domain.world import WANTED, Changes, RetryPolicy, World
from suzumio.scheduler.handlers import build_router
from suzumio.scheduler.holds import Hold, Holds
from suzumio.scheduler.hooks import Hooks, action_command
from suzumio.scheduler.settings import SchedulerSettings
from suzumio.scheduler.timers import Timers

log = get_logger(__name__)
ACTOR = "system:scheduler"
FOLD_BURST = 2_000  # messages folded before deciding, when many are queued
LEAD_TURN_SESSIONS = 5_000  # sessions a new leader looks at before it lets the loop go on
REVIEW_BACKOFF_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)  # after the 1st, 2nd, ... refused review
FORGET_EVERY_SECONDS = 300.0  # how often ended activations past the review window are dropped
APPEND_RETRY_SECONDS = 0.5  # after a failed append, before looking at what the log holds
# ... doubled for each append of the session refused in a row (a stream out of space, say),
# up to this: not two doomed appends a second per session against a server in trouble.
APPEND_RETRY_MAX_SECONDS = 30.0
_wait = asyncio.sleep  # (a test's seam: the pauses between a session's failed appends)
HANDOVER_WAIT_SECONDS = 5.0  # a handover waits this long for a decision of ours to land

_decisions = meter.create_counter(
    "suzumio_scheduler_decisions", description="decisions appended, by kind and outcome"
)
_latency = meter.create_histogram(
    "suzumio_scheduler_start_seconds",
    unit="s",
    description="signal recorded to activation requested (the youngest signal of the batch)",
)


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class _Decision:
    """What one decision appends on a session, and what its span and metrics need."""

    session_id: str
    hold: Hold
    version: int
    events: Sequence[DomainEvent]
    kind: str
    youngest: datetime | None  # the youngest signal it starts: its scheduling latency
    origins: tuple[int, ...]  # the log positions of the signals it starts (their traces)


class _UnreachableError(Exception):
    """A review's command found no session service (or no answer in time): the review is
    done again later, which is safe as every id it sends is derived."""


@dataclass(frozen=True)
class _ReviewRetry:
    ended: Ended  # the activation whose review was cut short
    failures: int
    at: datetime  # not before


class Scheduler:
    def __init__(
        self,
        nc: NATS,
        topology: Topology,
        store: EventStore,
        commands: CommandClient,
        database_url: str,
        settings: SchedulerSettings,
        hooks: Hooks,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._nc = nc
        self._topology = topology
        self._session_prefix = topology.event_subject("session", "")
        self._store = store
        self._commands = commands
        self._settings = settings
        self._policy = policy.Settings(max_batch=settings.max_batch)
        self._hooks = hooks
        self._clock = clock
        self.world = World(
            RetryPolicy(settings.retry_budget, settings.retry_backoff_seconds),
            default_backend=settings.default_backend,
        )
        self.replica = Replica(nc, topology, database_url, "scheduler")
        self._admission = Admission()
        self._timers = Timers()
        self._timer_changed = asyncio.Event()
        self._dirty: set[str] = set()
        self._holds = Holds()  # decisions of ours in flight, one per session at most
        self._refused: dict[str, int] = {}  # session -> its appends not stored, in a row
        self._reviewing: set[str] = set()
        self._review_retry: dict[str, _ReviewRetry] = {}  # session -> a review to do again
        self._next_forget = 0.0  # loop time of the next `_forget_old_ends`
        self._tasks: set[asyncio.Task[None]] = set()
        self.folded = self.replica.folded  # follows world.position, for those who wait on it
        self.leading = False

    # -- running -------------------------------------------------------------------------
    @property
    def caught_up(self) -> bool:
        return self.replica.caught_up

    async def run(self, stop: asyncio.Event) -> None:
        await self.replica.run(stop, self._fold_loop, self._lead)

    async def _lead(self, done: asyncio.Event) -> None:
        if not await self.folded.caught_up(self._nc, self._topology, done):
            return
        self.leading = True
        log.info("scheduler.leading", position=self.world.position)
        # The last leader may have left work undone: every session that may have some is
        # looked at, in turns that let the fold and the commands in between (the fold keeps
        # every session ever opened, mostly idle: a million of them held the loop for 5 s).
        waiting = [
            s.id
            for s in self.world.sessions.values()
            if _may_need_work(s) or s.id in self._review_retry
        ]
        for at in range(0, len(waiting), LEAD_TURN_SESSIONS):
            if done.is_set():  # no longer leading: the next leader looks at them
                break
            self._dirty.update(waiting[at : at + LEAD_TURN_SESSIONS])
            self._decide()
            await asyncio.sleep(0)
        timers = asyncio.create_task(self._timer_loop(done))
        server = CommandServer(self._nc, self._topology, build_router(self))
        try:
            await server.start()  # only the leader answers: its state is the one that acts
            await done.wait()
        finally:
            self.leading = False
            timers.cancel()
            with contextlib.suppress(Exception):
                await server.drain(2.0)
            self._admission.clear()
            self._timers.clear()

    async def _fold_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            first = await self.replica.follower.next(timeout=0.5)
            if first is None:
                continue
            changes = Changes()
            self._fold(first, changes)
            for _ in range(FOLD_BURST):  # what is queued already: decide on the latest state
                more = self.replica.follower.next_nowait()
                if more is None:
                    break
                self._fold(more, changes)
            replaying = not self.caught_up
            await self.folded.advance(self.world.position)
            if replaying and self.caught_up:
                log.info("scheduler.caught_up", position=self.world.position)
                self._next_forget = 0.0  # what the replay folded, at once
            if self.leading:
                self._dirty |= changes.sessions
                self._decide()
            # (A standby gathers nothing: had it, the sessions changed while it replayed —
            # every session ever opened — were all looked at when it took over, and held in
            # memory till then. A new leader looks at those that may have work.)
            self._forget_old_ends()

    def _forget_old_ends(self) -> None:
        """Now and then, the sessions' ended activations past the review window are
        forgotten (on every replica: a standby's fold is the state it would lead with)."""
        now = asyncio.get_running_loop().time()
        if now < self._next_forget:
            return
        self._next_forget = now + FORGET_EVERY_SECONDS
        window = timedelta(seconds=self._settings.review_window_seconds + 60.0)
        keep = self._reviewing.union(self._review_retry)
        forgotten = self.world.forget_ended(self._clock() - window, keep)
        if forgotten:
            log.info("scheduler.ends_forgotten", sessions=forgotten)

    def _fold(self, msg: LogMessage, changes: Changes) -> None:
        if WANTED.intersection(msg.types):
            pairs: list[tuple[EventEnvelope, DomainEvent]] = []
            try:
                envelopes = envelopes_of(msg.data)
            except Exception:  # no commit of events at all: it must not stop the fold
                # (each restart would replay the log up to it and stop there again)
                log.exception("scheduler.unreadable", seq=msg.seq)
                envelopes = []
            for envelope in envelopes:
                if envelope.type in WANTED:
                    try:
                        pairs.append((envelope, decode_data(envelope)))
                    except Exception:  # a newer release's schema: not ours to guess
                        log.warning("scheduler.undecodable", seq=msg.seq, type=envelope.type)
            self.world.apply(msg.seq, pairs, changes, self._clock())
            self._refile(changes)
        else:
            self.world.position = msg.seq
        if msg.subject.startswith(self._session_prefix):
            # The session's head is the message's last version, whatever its events: one the
            # scheduler does not fold (a compaction, a checkpoint) moves it too, and the next
            # decision is appended on it rather than refused again and again.
            session_id = msg.subject[len(self._session_prefix) :]
            s = self.world.sessions.get(session_id)
            if s is not None and msg.version > s.version:
                s.version, s.seq = msg.version, msg.seq
            self._store.observe("session", session_id, msg.version, msg.seq)
            if self._holds.reached(session_id, msg.version):  # our decision (or a newer fact)
                changes.sessions.add(session_id)  # even if none of its events is folded

    # -- deciding ------------------------------------------------------------------------
    def _decide(self) -> None:
        now = self._clock()
        dirty, self._dirty = self._dirty, set()
        for session_id in dirty:
            self._evaluate(session_id, now)
        for session_id in self._admission.admit(self._fits, self._has_room, self._pool_has_room):
            self._start(session_id, now)

    def _plan(self, s: SessionSchedule, now: datetime) -> Plan:
        plan = policy.decide(s, now, startable=self.world.startable(s), settings=self._policy)
        if plan.wake_at is not None and self._timers.add(plan.wake_at, s.id):
            self._timer_changed.set()
        return plan

    def _evaluate(self, session_id: str, now: datetime) -> None:
        s = self.world.sessions.get(session_id)
        if s is None or session_id in self._holds:
            return  # an append of ours is on its way: look again when it is folded
        self._maybe_review(s, now)
        plan = self._plan(s, now)
        if plan.cancel is not None:
            self._execute(s, plan)  # a P0 takes the place of the live one: no admission
        elif plan.start is not None:
            if plan.close_failed:
                self._execute(s, Plan(plan.close_failed))
            self._admission.want(s.project_id, s.id, self.world.pool_of(s.agent_id))
        elif plan.close_failed:
            self._execute(s, plan)

    def _has_room(self, project_id: str) -> bool:
        in_project = self.world.running_by_project[project_id] + self._holds.taken_in(project_id)
        return in_project < self.world.limit_of(project_id)

    def _refile(self, changes: Changes) -> None:
        """Waiting sessions onto the pools they would start on now, if any moved."""
        if changes.pools_moved:
            changes.pools_moved = False
            if self.leading:  # (a standby waits on nothing: `_lead` looks afresh)
                self._admission.refile(self._pool_of_session)

    def _pool_of_session(self, session_id: str) -> str:
        return self.world.pool_of(self.world.sessions[session_id].agent_id)

    def _pool_has_room(self, pool: str) -> bool:
        pool_limit = self._settings.pool_limits.get(pool)
        if pool_limit is None:
            return True
        return self.world.running_by_pool[pool] + self._holds.taken_in_pool(pool) < pool_limit

    def _fits(self, project_id: str, session_id: str) -> bool:
        s = self.world.sessions[session_id]
        if session_id in self._holds:
            return False
        return self._has_room(project_id) and self._pool_has_room(self.world.pool_of(s.agent_id))

    def _start(self, session_id: str, now: datetime) -> None:
        s = self.world.sessions[session_id]
        plan = self._plan(s, now)  # again: the state may have moved since it asked
        if plan.start is None:
            return
        # A P0 takes the replaced activation's place; a start holds capacity until folded.
        capacity = (s.project_id, self.world.pool_of(s.agent_id)) if plan.cancel is None else None
        self._execute(s, plan, capacity)

    def _execute(
        self, s: SessionSchedule, plan: Plan, capacity: tuple[str, str] | None = None
    ) -> None:
        events: list[DomainEvent] = [
            SignalClosed(signal_id=signal_id, outcome=SignalOutcome.FAILED, reason=reason[:2_000])
            for signal_id, reason in plan.close_failed
        ]
        kind = "close"
        if plan.start is not None:
            activation_id = new_id()
            if plan.cancel is not None:
                kind = "preempt"
                events.append(
                    ActivationCancelRequested(
                        activation_id=plan.cancel, reason="replaced: a P0 signal arrived"
                    )
                )
            else:
                kind = "start"
            events += [
                ActivationRequested(
                    activation_id=activation_id,
                    agent_id=s.agent_id,
                    signal_ids=plan.start.signal_ids,
                    reason=plan.start.reason,
                    attempt=plan.start.attempt,
                    pool=self.world.pool_of(s.agent_id),
                    project_id=s.project_id,
                    replaces=plan.cancel,
                ),
                SignalsDelivered(activation_id=activation_id, signal_ids=plan.start.signal_ids),
            ]
        elif plan.cancel is not None:  # a P0 where nothing may start: stop now all the same
            kind = "stop"
            events.append(
                ActivationCancelRequested(
                    activation_id=plan.cancel,
                    reason="stopped: a P0 signal arrived (the next activation waits for the "
                    "session's reopening or its agent's enabling)",
                )
            )
        chosen = plan.start.signal_ids if plan.start else ()
        stamps = [s.pending[i].recorded_at for i in chosen if i in s.pending]
        youngest = max((t for t in stamps if t is not None), default=None)
        origins = tuple(s.pending[i].seq for i in chosen if i in s.pending)
        hold = self._holds.take(s.id, s.version + len(events), capacity)
        decision = _Decision(s.id, hold, s.version, events, kind, youngest, origins)
        self._spawn(self._append(decision))

    async def _append(self, d: _Decision) -> None:
        session_id, hold, kind = d.session_id, d.hold, d.kind
        try:
            async with self._span(d):
                await self._store.append(session_id, d.events, d.version, EventMeta(actor=ACTOR))
        except ConcurrencyConflictError as exc:
            _decisions.add(1, {"kind": kind, "outcome": "conflict"})
            self._refused.pop(session_id, None)
            self._after_conflict(session_id, hold, exc.actual_version)
        except Exception as exc:
            _decisions.add(1, {"kind": kind, "outcome": "error"})
            log.warning("scheduler.append_failed", session=session_id, error=repr(exc))
            await self._after_error(session_id, hold)
        else:
            _decisions.add(1, {"kind": kind, "outcome": "ok"})
            self._refused.pop(session_id, None)
            if d.youngest is not None:
                _latency.record(max((self._clock() - d.youngest).total_seconds(), 0.0))

    @contextlib.asynccontextmanager
    async def _span(self, d: _Decision) -> AsyncIterator[None]:
        """The decision's span, when spans are exported: in the trace of the first signal it
        starts (read back from the log, `trace_origin`), linked to the other signals' traces.
        Its append carries it, so the orchestrator's launch is its child."""
        if not telemetry.spans_exported():
            yield
            return
        subject = self._topology.event_subject("session", d.session_id)
        parent, links = await trace_origin.origin(
            self._nc, self._topology.events_stream, subject, d.origins
        )
        requested = next((e for e in d.events if isinstance(e, ActivationRequested)), None)
        attributes: dict[str, str | int] = {"suzumio.session": d.session_id, "suzumio.kind": d.kind}
        if requested is not None:
            attributes |= {
                "suzumio.activation": requested.activation_id,
                "suzumio.signals": len(requested.signal_ids),
                "suzumio.attempt": requested.attempt,
            }
        with telemetry.tracer.start_as_current_span(
            "scheduler.decision", context=parent or Context(), links=links, attributes=attributes
        ):
            yield

    def _again(self, session_id: str, hold: Hold) -> None:
        if not self._holds.release(session_id, hold):
            return  # the fold released it already, and looked again then
        self._dirty.add(session_id)
        if self.leading:
            self._decide()

    async def _after_error(self, session_id: str, hold: Hold) -> None:
        """An append that failed may have landed all the same (its answer lost, the store
        unable to tell): until the session's head says which, it keeps its hold, and a start
        its capacity. Released at once, another session could take that capacity while the
        fold has not yet shown the landed start — one over the project's limit."""
        refused = self._refused.get(session_id, 0)
        pause = min(APPEND_RETRY_SECONDS * 2**refused, APPEND_RETRY_MAX_SECONDS)
        while True:
            await _wait(pause)
            if not self._holds.owns(session_id, hold):
                return  # the fold reached it (landed, or a newer fact) and looked again
            try:
                # As the leader has it: a follower behind the append would say "not stored"
                # of a start that was, and its capacity would go to another session.
                head = await self._store.head("session", session_id, latest=True)
            except Exception as exc:
                log.warning("scheduler.head_unknown", session=session_id, error=repr(exc))
                pause = min(pause * 2, APPEND_RETRY_MAX_SECONDS)
                continue
            if head.version < hold.target:
                self._refused[session_id] = refused + 1  # the next try waits longer
                self._again(session_id, hold)  # not stored: decide again
            else:
                # In the log (or a newer write is): the fold releases the hold when it gets
                # there, as for any append of ours.
                self._refused.pop(session_id, None)
            return

    def _after_conflict(self, session_id: str, hold: Hold, actual: int) -> None:
        """Someone wrote first: decide on what they wrote, once it is folded. Deciding before
        would be on the same stale version, refused again at once, as fast as the store
        answers, for as long as the fold lags. The session stays held (as for an append of
        ours) until the fold reaches `actual`; `_fold` then releases it and looks again."""
        if not self._holds.owns(session_id, hold):
            return  # a late answer: the fold released it, and a newer decision may hold it
        s = self.world.sessions.get(session_id)
        if s is None or s.version >= actual:
            self._again(session_id, hold)
            return
        self._holds.free_capacity(hold)  # no capacity is taken while it waits
        hold.target = actual

    # -- timers --------------------------------------------------------------------------
    async def _timer_loop(self, done: asyncio.Event) -> None:
        while not done.is_set():
            next_at = self._timers.next_at()
            wait = 60.0 if next_at is None else (next_at - self._clock()).total_seconds()
            self._timer_changed.clear()
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._timer_changed.wait(), min(wait, 60.0))
            due = self._timers.pop_due(self._clock())
            if due and self.leading:
                self._dirty |= due
                self._decide()

    # -- P1 handover ---------------------------------------------------------------------
    async def take_signals(
        self, session_id: str, activation_id: str, received: Sequence[str]
    ) -> list[SignalSpec]:
        """The due P1 signals for the session's live activation, recorded as delivered to
        it, plus those handed to it before that it has not `received` (a lost reply loses
        nothing). Raises ConflictError when the activation is not live (ended, or replaced
        by a P0: fenced), UnavailableError when this replica cannot tell yet (its fold behind
        the log, which the activation's start may be in)."""
        caught_up = False
        for _ in range(20):
            s = self.world.sessions.get(session_id)
            if s is None or not s.opened:
                raise NotFoundError("session not found")
            # A decision of ours is landing: see it first.
            settled = await self._holds.settled(session_id, HANDOVER_WAIT_SECONDS)
            live = s.live
            due = policy.handover(s, activation_id, self._clock())
            if live is None or due is None:
                if not caught_up:
                    # Its start may be in the log and not yet folded here (the orchestrator
                    # launched it from its own fold, a leader's took over): not live is only
                    # known once the fold reached what was stored before this call —
                    # refused, a healthy activation exited as fenced and was done again.
                    await self._fold_to_now()
                    caught_up = True
                    continue
                raise ConflictError("the activation is not live (it ended or was replaced)")
            known = set(received)
            again = [x for x in live.signals if x.id in live.handed and x.id not in known]
            if again or not due or not settled:
                # Still held, by a decision slow to land: a handover appended beside it would
                # race it, and take over its hold. Or ones handed before were not received
                # (their reply lost): they go again alone, a reply's worth at most. The due
                # ones go at the next tool boundary.
                return await self._specs(session_id, again)
            ids = tuple(x.id for x in due)
            hold = self._holds.take(session_id, s.version + 1)
            try:
                await self._store.append(
                    session_id,
                    [SignalsDelivered(activation_id=activation_id, signal_ids=ids)],
                    s.version,
                    EventMeta(actor=ACTOR),
                )
            except ConcurrencyConflictError:
                # Unless the fold released it (for a newer one): released, the session is
                # looked at again — what the fold skipped while it was held (the live one's
                # end, a due timer) is decided on, not left until something else touches it.
                self._again(session_id, hold)
                end = await stream_last_seq(self._nc, self._topology.events_stream)
                await self.folded.reached(end, 5.0)
                continue
            except BaseException:
                self._again(session_id, hold)
                raise
            _decisions.add(1, {"kind": "handover", "outcome": "ok"})
            return await self._specs(session_id, due)
        raise ConflictError("the session kept changing; try again")

    async def _specs(self, session_id: str, signals: list[Signal]) -> list[SignalSpec]:
        """The signals as handed over, a long message's text and a large payload read from
        their commit."""
        subject = self._topology.event_subject("session", session_id)
        specs = []
        for signal in signals:
            text, payload = signal.text, signal.payload
            at = signal.text_at or signal.payload_at  # the signal's own commit, either way
            if at is not None:
                # From a replica holding it: one behind would answer none, and the signal go
                # out, recorded delivered, without its text or payload.
                stored = await first_after(
                    self._nc, self._topology.events_stream, subject, at - 1, min_last_seq=at
                )
                if stored is None or stored.seq != at:
                    raise UnavailableError("a signal's commit could not be read; try again")
                if signal.text_at is not None:
                    text = _text_in(stored, signal.message_id)
                if signal.payload_at is not None:
                    payload = _payload_in(stored, signal.id)
            specs.append(_spec(signal, text, payload))
        return specs

    # -- a cancel asked for (the API) ----------------------------------------------------
    async def cancel_activation(
        self, activation_id: str, project_id: str, reason: str, meta: EventMeta
    ) -> CommandAccepted:
        """Appends `session.activation_cancel_requested` for a live activation of the project,
        on the condition that its session is still at the version this looked at — the event
        a P0 appends, so the orchestrator, the tool-broker and the session service act on it
        alike (killed, fenced). A second cancel, while the first is on its way, appends
        nothing. Raises NotFoundError (no such activation in the project) or ConflictError
        (it has already ended: `details.status`)."""
        await self._fold_to_now()  # what was stored before the command is known
        for _ in range(20):
            activation = self.world.activations.get(activation_id)
            if activation is None:
                raise await self._not_live(activation_id, project_id)
            if activation.project_id != project_id:
                raise NotFoundError("activation not found")
            if activation.cancel_requested:
                return CommandAccepted(
                    result={"outcome": "already_requested", "session_id": activation.session_id}
                )
            session_id = activation.session_id
            # A decision of ours on the session is landing (a P0 may be replacing this very
            # activation): see it first. Taking the session now would take over its hold.
            if not await self._holds.settled(session_id, HANDOVER_WAIT_SECONDS):
                raise UnavailableError("the activation's session is busy; try again")
            activation = self.world.activations.get(activation_id)
            if activation is None or activation.cancel_requested:
                continue  # it ended, or was cancelled, while we waited: answer for that
            s = self.world.sessions[session_id]
            hold = self._holds.take(session_id, s.version + 1)
            why = f"cancelled by {meta.actor}" + (f": {reason}" if reason else "")
            cancel = ActivationCancelRequested(
                activation_id=activation_id, reason=why, closes_work=True
            )
            # The work goes with it: a user who stops an activation does not want it started
            # again at once on the same signals (a P0's cancel, by contrast, queues them
            # again for the activation that replaces it).
            closes = [
                SignalClosed(signal_id=x.id, outcome=SignalOutcome.CANCELLED, reason=why)
                for x in activation.signals
            ]
            # One append holds at most 1,000 events (and a bus message's bytes), and the
            # activation may have been handed any number of P1s: the cancel and a batch of
            # closes together, the rest after.
            closes, rest = closes[:MAX_CLOSES_PER_DECISION], closes[MAX_CLOSES_PER_DECISION:]
            try:
                written = await self._store.append(session_id, [cancel, *closes], s.version, meta)
            except ConcurrencyConflictError:
                _decisions.add(1, {"kind": "cancel", "outcome": "conflict"})
                self._again(session_id, hold)  # as a handover's conflict: looked at again
                await self._fold_to_now()
                continue
            except BaseException:
                self._again(session_id, hold)
                raise
            _decisions.add(1, {"kind": "cancel", "outcome": "ok"})
            await self._close_rest(session_id, rest, meta)
            return CommandAccepted(
                events=written.events,
                position=written.seq,
                result={"outcome": "requested", "session_id": session_id},
            )
        raise ConflictError("the session kept changing; try again")

    async def _close_rest(
        self, session_id: str, closes: Sequence[SignalClosed], meta: EventMeta
    ) -> None:
        """The closes that did not go with a cancel (past 200 signals), a batch per append.
        The cancel is stored whatever happens here: one that fails is logged, not the
        cancel's answer (its signals not closed queue again when the activation ends)."""
        for start in range(0, len(closes), MAX_CLOSES_PER_DECISION):
            chunk = closes[start : start + MAX_CLOSES_PER_DECISION]
            try:
                await self._store.append_next(session_id, chunk, meta)
            except Exception as exc:
                log.warning("scheduler.cancel_closes_failed", session=session_id, error=repr(exc))
                return

    async def _fold_to_now(self) -> None:
        end = await stream_last_seq(self._nc, self._topology.events_stream)
        if not await self.folded.reached(end, 5.0):
            raise UnavailableError("the scheduler is behind the log; try again")

    async def _not_live(self, activation_id: str, project_id: str) -> CommandError:
        """Why an activation the fold does not hold cannot be cancelled. The fold drops an
        activation when it ends: its own subject tells whether it ever was, and how it
        ended."""
        stream = await self._store.load("activation", activation_id)
        types = [e.envelope.type for e in stream.events]
        started = [e.data for e in stream.events if isinstance(e.data, ActivationStarted)]
        if not started or started[0].project_id != project_id:
            # Its project cannot be confirmed (it ended before it started, its subject holds
            # no `started`): how it ended is not told to whoever asks.
            return NotFoundError("activation not found")
        ended = [t for t in types if t in TERMINAL_ACTIVATION_EVENTS]
        if ended:
            status = ended[0].removeprefix("activation.")
            return ConflictError(f"the activation has already ended ({status})", status=status)
        return ConflictError("the activation is not live", status="unknown")

    # -- hooks and the nudge rule ---------------------------------------------------------
    def _maybe_review(self, s: SessionSchedule, now: datetime) -> None:
        if s.id in self._reviewing:
            return  # looked at again when that review is done
        window = self._settings.review_window_seconds
        retry = self._review_retry.get(s.id)
        if retry is not None and (now - retry.ended.at).total_seconds() > window:
            # The session service stayed unreachable all this while: given up.
            log.warning(
                "scheduler.review_dropped", session=s.id, activation=retry.ended.activation_id
            )
            del self._review_retry[s.id]
            retry = None
        if retry is not None:  # one cut short goes first: a later end does not void it
            if now < retry.at:
                if self._timers.add(retry.at, s.id):
                    self._timer_changed.set()
                return
            ended = retry.ended
        else:
            last = s.last_ended
            if last is None or last.activation_id == s.reviewed:
                return
            if (now - last.at).total_seconds() > window:
                s.reviewed = last.activation_id  # too old: ended while no scheduler ran
                return
            ended = last
        self._reviewing.add(s.id)
        self._spawn(self._review(s, ended))

    async def _review(self, s: SessionSchedule, ended: Ended) -> None:
        retry: _ReviewRetry | None = None
        try:
            agent = self.world.agents.get(s.agent_id)
            toolpacks = agent.toolpacks if agent else ()
            # The state is built only for a hook that will see it (most agents enable no
            # toolpack with hooks of its own).
            if self._hooks.any_for(toolpacks):
                actions = await self._hooks.run(self._hook_state(s, ended, toolpacks))
            else:
                actions = []
            performed = [await self._perform(s, ended, name, action) for name, action in actions]
            if not any(performed) and policy.needs_nudge(ended):
                await self._nudge(s, ended)
        except _UnreachableError as exc:
            retry = self._retry_review_later(s, ended, exc)
        except Exception:
            log.exception("scheduler.review_failed", session=s.id)
        finally:
            if retry is None:
                self._review_retry.pop(s.id, None)
                newest = s.last_ended.activation_id if s.last_ended else None
                if s.reviewed != newest:  # never back over a newer one reviewed already
                    s.reviewed = ended.activation_id
            self._reviewing.discard(s.id)
        # An activation may have ended while this review ran, and nothing else would look
        # at the session for it (or the review is to be done again, when its timer fires).
        if self.leading:
            self._dirty.add(s.id)
            self._decide()

    def _retry_review_later(
        self, s: SessionSchedule, ended: Ended, exc: _UnreachableError
    ) -> _ReviewRetry:
        last = self._review_retry.get(s.id)
        failures = last.failures + 1 if last and last.ended == ended else 1
        wait = REVIEW_BACKOFF_SECONDS[min(failures, len(REVIEW_BACKOFF_SECONDS)) - 1]
        retry = _ReviewRetry(ended, failures, self._clock() + timedelta(seconds=wait))
        self._review_retry[s.id] = retry
        log.warning(
            "scheduler.review_deferred",
            session=s.id,
            activation=ended.activation_id,
            attempt=failures,
            retry_in=wait,
            error=str(exc.__cause__ or exc),
        )
        return retry

    def _hook_state(
        self, s: SessionSchedule, ended: Ended, toolpacks: tuple[str, ...]
    ) -> AgentSchedulingState:
        return AgentSchedulingState(
            toolpacks=toolpacks,
            project_id=s.project_id,
            agent_id=s.agent_id,
            session_id=s.id,
            live_activation_id=s.live.id if s.live else None,
            pending=tuple(
                PendingSignalView(
                    id=x.id, kind=x.kind, priority=x.priority, not_before=x.not_before
                )
                for x in sorted(s.pending.values(), key=lambda x: x.order)
            ),
            last_activation=EndedActivationView(
                id=ended.activation_id,
                outcome=ended.outcome,
                useful_effect=ended.useful,
                signal_ids=ended.signal_ids,
            ),
        )

    async def _perform(
        self, s: SessionSchedule, ended: Ended, hook_name: str, action: HookAction
    ) -> bool:
        """Sends one hook action; False if it was skipped. One the commands refuse (a payload
        too large, a time out of range) or that fails here is logged and skipped alone: the
        other actions of the review, other hooks' too, are still sent. An unreachable session
        service still cuts the whole review short, to be done again (see _review)."""
        try:
            return await self._send(action_command(s.id, ended.activation_id, hook_name, action))
        except _UnreachableError:
            raise
        except ValidationError as exc:
            log.warning(
                "scheduler.hook_action_invalid",
                session=s.id,
                hook=hook_name,
                key=action.key,
                error=str(exc)[:500],
            )
            return False
        except Exception:
            log.exception("scheduler.hook_action_failed", session=s.id, hook=hook_name)
            return False

    async def _nudge(self, s: SessionSchedule, ended: Ended) -> None:
        await self._send(
            RecordSignal(
                session_id=s.id,
                signal_id=derived_id("nudge", ended.activation_id),
                kind=SignalKind.NUDGE,
                priority=Priority.P2,
                payload={"activation_id": ended.activation_id, "signal_ids": ended.signal_ids},
            )
        )

    async def _send(self, command: RecordSignal | PostMessage) -> bool:
        """Whether the command was done (False: refused, and logged)."""
        try:
            await self._commands.send(command, actor=ACTOR)
        except ConflictError:
            return True  # recorded already (or the session closed meanwhile)
        except (UnavailableError, CommandTimeoutError) as exc:
            # Not refused, unanswered: the whole review is done again later (see _review).
            raise _UnreachableError(command.verb) from exc
        except CommandError as exc:
            log.warning("scheduler.command_refused", verb=command.verb, error=str(exc))
            return False
        return True

    def _spawn(self, work: object) -> None:
        assert asyncio.iscoroutine(work)
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _may_need_work(s: SessionSchedule) -> bool:
    """Whether a decision or a review may have something to do for the session."""
    return bool(
        s.pending
        or s.failing
        or s.live is not None
        or (s.last_ended is not None and s.last_ended.activation_id != s.reviewed)
    )


def _spec(signal: Signal, text: str | None, payload: dict[str, Any]) -> SignalSpec:
    return SignalSpec(
        id=signal.id,
        kind=signal.kind,
        priority=signal.priority,
        payload=payload,
        text=text,
        message_id=signal.message_id,
    )


def _payload_in(stored: StoredMessage | None, signal_id: str) -> dict[str, Any]:
    """The payload of signal `signal_id` in the commit `stored`."""
    for envelope in envelopes_of(stored.data) if stored is not None else ():
        if envelope.type == SignalRecorded.event_type:
            data = decode_data(envelope)
            if isinstance(data, SignalRecorded) and data.signal_id == signal_id:
                return dict(data.payload)
    return {}


def _text_in(stored: StoredMessage | None, message_id: str | None) -> str | None:
    """The text of message `message_id` in the commit `stored`."""
    for envelope in envelopes_of(stored.data) if stored is not None else ():
        if envelope.type == SessionMessageAppended.event_type:
            data = decode_data(envelope)
            if isinstance(data, SessionMessageAppended) and data.message_id == message_id:
                return data.text
    return None
