"""The scheduler's whole state, folded from the log: sessions with their pending signals and
live activation, agents, projects' limits and runtime profiles, and how many activations hold
capacity where. Every replica folds the same log to the same state; only the leader acts."""

from __future__ import annotations

import json
from collections import Counter, deque
from collections.abc import Container
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from sys import intern
from typing import Any

import orjson

from suzumio.contracts.envelope import DomainEvent, EventEnvelope
from suzumio.contracts.events import (
    ActivationCancelled,
    ActivationCancelRequested,
    ActivationCompleted,
    ActivationFailed,
    ActivationRequested,
    ActivationStarted,
    ActivationTimedOut,
    AgentCreated,
    AgentDisabled,
    AgentEnabled,
    AgentUpdated,
    ProjectCreated,
    ProjectLimitsChanged,
    RuntimeProfileRemoved,
    RuntimeProfileSet,
    SessionClosed,
    SessionMessageAppended,
    SessionOpened,
    SessionReopened,
    SignalClosed,
    SignalRecorded,
    SignalsDelivered,
    ToolCallFinished,
    ToolCallStarted,
)
from suzumio.contracts.values import Backend, ProjectLimits, RuntimeProfileSpec, SignalKind
from suzumio.scheduler.domain.model import (
    Activation,
    AgentInfo,
    Ended,
    EndOutcome,
    Failing,
    SessionSchedule,
    Signal,
)

# A pending signal's message text is kept in memory up to this long; a longer one is read
# from the log when the signal is handed over (`Signal.text_at`). So is its payload, as JSON
# (`Signal.payload_at`).
INLINE_TEXT_CHARS = 2_000
INLINE_PAYLOAD_BYTES = 2_000

WANTED: frozenset[str] = frozenset(
    cls.event_type
    for cls in (
        SessionOpened,
        SessionClosed,
        SessionReopened,
        SessionMessageAppended,
        SignalRecorded,
        SignalsDelivered,
        SignalClosed,
        ActivationRequested,
        ActivationCancelRequested,
        ActivationStarted,
        ActivationCompleted,
        ActivationFailed,
        ActivationCancelled,
        ActivationTimedOut,
        ToolCallStarted,
        ToolCallFinished,
        AgentCreated,
        AgentUpdated,
        AgentDisabled,
        AgentEnabled,
        ProjectCreated,
        ProjectLimitsChanged,
        RuntimeProfileSet,
        RuntimeProfileRemoved,
    )
)
"""The event types the scheduler folds; it skips the rest without decoding them."""


@dataclass(frozen=True)
class RetryPolicy:
    budget: int = 3  # failed activations a signal may be part of before it is closed failed
    backoff_seconds: tuple[float, ...] = (2.0, 10.0, 60.0)

    def backoff(self, consecutive_failures: int) -> timedelta:
        index = min(max(consecutive_failures, 1), len(self.backoff_seconds)) - 1
        return timedelta(seconds=self.backoff_seconds[index])


@dataclass
class ProjectInfo:
    limits: ProjectLimits = field(default_factory=ProjectLimits)
    profiles: dict[str, RuntimeProfileSpec] = field(default_factory=dict)


@dataclass
class Changes:
    """What one log message changed: the sessions to look at again, and whether capacity
    was freed (so waiting sessions elsewhere may start)."""

    sessions: set[str] = field(default_factory=set)
    freed: bool = False
    # An agent's runtime profile, or a profile, changed: sessions may count against another
    # pool than the one they wait on.
    pools_moved: bool = False


class World:
    def __init__(
        self, retry: RetryPolicy | None = None, *, default_backend: Backend = Backend.PROCESS
    ) -> None:
        self.retry = retry or RetryPolicy()
        # Where the orchestrator runs an agent without a runtime profile (its
        # SUZUMIO_DEFAULT_BACKEND): that agent's activations count against this pool.
        self.default_backend = default_backend
        self.sessions: dict[str, SessionSchedule] = {}
        self.activations: dict[str, Activation] = {}  # requested and not yet ended
        self.agents: dict[str, AgentInfo] = {}
        self.projects: dict[str, ProjectInfo] = {}
        self.running_by_project: Counter[str] = Counter()
        self.running_by_pool: Counter[str] = Counter()
        self.position = 0  # the last log sequence folded
        self._ends: deque[tuple[datetime, str]] = deque()  # (ended at, session), as folded

    # -- queries -------------------------------------------------------------------------
    def session(self, session_id: str) -> SessionSchedule:
        found = self.sessions.get(session_id)
        if found is None:
            found = self.sessions[session_id] = SessionSchedule(session_id)
        return found

    def pool_of(self, agent_id: str) -> str:
        """The capacity pool an agent's activations count against: the worker pool of its
        runtime profile (backend `pool`), else its backend (the default backend for an agent
        without one)."""
        agent = self.agents.get(agent_id)
        project = self.projects.get(agent.project_id) if agent else None
        spec = None
        if agent and project and agent.runtime_profile:
            spec = project.profiles.get(agent.runtime_profile)
        if spec is None:  # (no spec built for it: this is asked for every session waiting)
            return self.default_backend.value
        if spec.backend is Backend.POOL and spec.pool:
            return spec.pool
        # Another backend ignores a `pool` its profile names: it runs there, not in a pool.
        return spec.backend.value

    def limit_of(self, project_id: str) -> int:
        project = self.projects.get(project_id)
        return (project.limits if project else ProjectLimits()).max_concurrent_activations

    def startable(self, s: SessionSchedule) -> bool:
        """The session exists, is open, and its agent may run."""
        agent = self.agents.get(s.agent_id)
        return s.opened and not s.closed and agent is not None and not agent.disabled

    def forget_ended(self, before: datetime, keep: Container[str] = ()) -> int:
        """Forgets the last ended activation of the sessions where it ended before `before`
        (the review window's start: no review looks at it any more), except those in `keep`
        (under review, looked at again next time); returns how many. Left in the fold, it is
        most of an idle session's memory, and the fold keeps every session ever opened. Only
        the ends past `before` are visited (`_ends`, in the order they were folded), never
        every session."""
        forgotten = 0
        kept: list[tuple[datetime, str]] = []
        while self._ends and self._ends[0][0] < before:
            at, session_id = self._ends.popleft()
            s = self.sessions.get(session_id)
            if s is None or s.last_ended is None or s.last_ended.at != at:
                continue  # a later end of the session took its place: queued itself
            if session_id in keep:
                kept.append((at, session_id))
                continue
            s.last_ended, s.reviewed = None, None
            # A dict emptied by pops keeps the table it grew to: an idle session's own two
            # would be most of what it costs.
            if not s.pending:
                s.pending = {}
            if not s.failing:
                s.failing = {}
            forgotten += 1
        self._ends.extendleft(reversed(kept))
        return forgotten

    # -- folding -------------------------------------------------------------------------
    def apply(
        self,
        seq: int,
        envelopes: list[tuple[EventEnvelope, DomainEvent]],
        changes: Changes,
        now: datetime | None = None,
    ) -> None:
        """Fold one log message (one commit of one aggregate). `now`: the folding
        scheduler's clock — an event's time is its writer's clock, and one dated after `now`
        (a writer whose clock runs ahead) counts as happening now."""
        texts: dict[str, str] = {}  # a message and its signal share a commit
        for envelope, data in envelopes:
            self._apply(seq, envelope, data, texts, changes, now)
        self.position = seq

    def _apply(
        self,
        seq: int,
        env: EventEnvelope,
        data: DomainEvent,
        texts: dict[str, str],
        changes: Changes,
        now: datetime | None,
    ) -> None:
        at = env.occurred_at if env.occurred_at.tzinfo else env.occurred_at.replace(tzinfo=UTC)
        if now is not None and at > now:
            # Else an orchestrator's clock ahead by an hour put off its failed activations'
            # retries by that hour, and held every later end in the fold (`forget_ended`
            # stops at the first end not yet past) until its time came.
            at = now
        if env.aggregate == "session":
            s = self.session(env.aggregate_id)
            s.version, s.seq = env.version, seq
            changes.sessions.add(s.id)
            self._session_event(s, seq, at, data, texts, changes)
        elif env.aggregate == "activation":
            self._activation_event(env.aggregate_id, at, data, changes)
        elif env.aggregate == "agent":
            self._agent_event(env.aggregate_id, data, changes)
        elif env.aggregate == "project":
            self._project_event(env.aggregate_id, data, changes)

    def _session_event(  # noqa: C901, PLR0912 - one branch per event type reads best here
        self,
        s: SessionSchedule,
        seq: int,
        at: datetime,
        data: DomainEvent,
        texts: dict[str, str],
        changes: Changes,
    ) -> None:
        match data:
            case SessionOpened():
                # One string per project and agent, however many sessions name them.
                s.project_id, s.agent_id = intern(data.project_id), intern(data.agent_id)
                s.opened = True
            case SessionClosed():
                s.closed = True
            case SessionReopened():
                s.closed = False
            case SessionMessageAppended():
                texts[data.message_id] = data.text
                # The live activation's own entry only: another agent's message posted here
                # (through the tool-broker) is authored by an agent too, but names no
                # activation of this session, and is no effect of the live one. And only what
                # it said to the user (assistant text): the runner records every turn, the
                # signals it was given (as user entries) and every tool result, failed ones
                # too — counting those would make every activation useful, and no nudge fire.
                live = s.live
                if (
                    data.author.kind == "agent"
                    and live
                    and data.activation_id == live.id
                    and data.role == "assistant"
                    and data.text.strip()
                ):
                    live.useful = True
            case SignalRecorded():
                text = texts.get(data.message_id or "")
                long = text is not None and len(text) > INLINE_TEXT_CHARS
                size = _json_bytes(data.payload) if data.payload else 0
                large = size > INLINE_PAYLOAD_BYTES
                s.pending[data.signal_id] = Signal(
                    id=data.signal_id,
                    kind=data.kind,
                    priority=data.priority,
                    seq=seq,
                    recorded_at=at,
                    not_before=data.not_before,
                    message_id=data.message_id,
                    text=None if long else text,
                    text_at=seq if long else None,
                    payload={} if large else dict(data.payload),
                    payload_at=seq if large else None,
                    payload_size=size,
                )
                if data.kind is SignalKind.NUDGE:  # the nudge names what it reviewed
                    s.reviewed = str(data.payload.get("activation_id", "")) or s.reviewed
            case ActivationRequested():
                self._requested(s, data, changes)
            case SignalsDelivered():
                self._delivered(s, data)
            case ActivationCancelRequested():
                activation = self.activations.get(data.activation_id)
                if activation is not None:
                    _wind_down(activation)
                if s.live is not None and s.live.id == data.activation_id:
                    s.live = None
            case SignalClosed():
                s.pending.pop(data.signal_id, None)
                s.failing.pop(data.signal_id, None)
                # Closed with the activation that carries it being cancelled (a user's
                # cancel closes the work with it): when that activation ends, the signal
                # must not queue again. (Signals are closed rarely: this loop is cheap.)
                for activation in self.activations.values():
                    if activation.session_id == s.id and activation.cancel_requested:
                        activation.signals = [
                            x for x in activation.signals if x.id != data.signal_id
                        ]

    def _requested(self, s: SessionSchedule, data: ActivationRequested, changes: Changes) -> None:
        batch = [self._take(s, signal_id) for signal_id in data.signal_ids]
        activation = Activation(
            id=data.activation_id,
            session_id=s.id,
            project_id=data.project_id or s.project_id,
            pool=data.pool or self.pool_of(s.agent_id),
            attempt=data.attempt,
            reason=data.reason,
            signals=[b for b in batch if b is not None],
        )
        if s.live is not None:  # only a P0 replaces a live one, and it cancels it first
            _wind_down(s.live)
        if data.replaces in self.activations:  # still winding down
            activation.replaced = data.replaces
        s.live = activation
        self.activations[activation.id] = activation
        self.running_by_project[activation.project_id] += 1
        self.running_by_pool[activation.pool] += 1
        changes.sessions.add(s.id)

    @staticmethod
    def _take(s: SessionSchedule, signal_id: str) -> Signal | None:
        """A signal leaves the pending set for an activation."""
        return s.pending.pop(signal_id, None)

    def _delivered(self, s: SessionSchedule, data: SignalsDelivered) -> None:
        live = s.live
        if live is None or live.id != data.activation_id:
            return
        known = {x.id for x in live.signals}
        for signal_id in data.signal_ids:
            if signal_id in known:
                continue  # delivered with the start batch
            signal = s.pending.pop(signal_id, None)
            if signal is not None:
                live.signals.append(signal)
                live.handed.append(signal_id)

    def _activation_event(
        self, activation_id: str, at: datetime, data: DomainEvent, changes: Changes
    ) -> None:
        activation = self.activations.get(activation_id)
        if activation is None:
            return  # ended already, or not one of ours
        changes.sessions.add(activation.session_id)
        match data:
            case ActivationStarted():
                activation.started = True
            case ToolCallStarted(read_only=True):
                activation.read_only_calls.add(data.call_id)
            case ToolCallFinished():
                done = data.status == "ok" and data.call_id not in activation.read_only_calls
                activation.useful = activation.useful or done
            case ActivationCompleted():
                activation.useful = activation.useful or bool(data.text.strip())
                self._ended(activation, "completed", at, changes)
            case ActivationFailed():
                self._ended(
                    activation, "failed", at, changes, data.reason, retryable=data.retryable
                )
            case ActivationTimedOut():
                reason = f"timed out after {data.timeout_seconds:g}s"
                self._ended(activation, "timed_out", at, changes, reason, retryable=True)
            case ActivationCancelled():
                reason = f"cancelled: {data.reason}" if data.reason else "cancelled"
                self._ended(activation, "cancelled", at, changes, reason, retryable=True)

    def _ended(
        self,
        activation: Activation,
        outcome: EndOutcome,
        at: datetime,
        changes: Changes,
        reason: str = "",
        *,
        retryable: bool = False,
    ) -> None:
        del self.activations[activation.id]
        self.running_by_project[activation.project_id] -= 1
        self.running_by_pool[activation.pool] -= 1
        changes.freed = True
        s = self.session(activation.session_id)
        if activation.cancel_requested:
            if s.live is not None and s.live.replaced == activation.id:
                s.live.replaced = None
            changes.sessions.add(s.id)  # a P0 held back while it wound down may go now
            # Replaced by a P0 (or cancelled on request). Finished anyway: its work is done.
            # Cancelled: its signals queue again, no failure counted (P1s go to the live
            # activation at its next tool boundary, the rest to the next start). A P0 among
            # them does not preempt again: it joins the next start, still first.
            if outcome != "completed":
                for signal in activation.signals:
                    signal.requeued = True
                    s.pending[signal.id] = signal
            return
        if s.live is activation:
            s.live = None
        s.last_ended = Ended(
            activation.id,
            outcome,
            activation.useful,
            tuple(x.id for x in activation.signals),
            frozenset(x.kind for x in activation.signals),
            at,
        )
        self._ends.append((at, s.id))
        if outcome == "completed":
            s.consecutive_failures, s.backoff_until = 0, None
            return
        # Failed, timed out, or cancelled by something other than a P0: the work was not
        # done. Retry it after a backoff, within each signal's budget.
        s.consecutive_failures += 1
        s.backoff_until = at + self.retry.backoff(s.consecutive_failures)
        for signal in activation.signals:
            signal.failures += 1
            if not retryable:
                s.failing[signal.id] = Failing(signal, reason or outcome)
            elif signal.failures >= self.retry.budget:
                s.failing[signal.id] = Failing(
                    signal, f"{reason or outcome} ({signal.failures} attempts)"
                )
            else:
                s.pending[signal.id] = signal

    def _agent_event(self, agent_id: str, data: DomainEvent, changes: Changes) -> None:
        match data:
            case AgentCreated():
                self.agents[agent_id] = AgentInfo(
                    data.project_id, data.runtime_profile, toolpacks=data.toolpacks
                )
            case AgentUpdated() if agent_id in self.agents:
                agent = self.agents[agent_id]
                if data.runtime_profile is not None:
                    agent.runtime_profile = data.runtime_profile
                    changes.pools_moved = True
                elif data.runtime_profile_cleared:
                    agent.runtime_profile = None
                    changes.pools_moved = True
                if data.toolpacks is not None:
                    agent.toolpacks = data.toolpacks
            case AgentDisabled() if agent_id in self.agents:
                self.agents[agent_id].disabled = True
            case AgentEnabled() if agent_id in self.agents:
                self.agents[agent_id].disabled = False
                # Its sessions may start again; nothing else would look at them, as their
                # signals were recorded (and refused) while it was disabled.
                changes.sessions.update(
                    s.id
                    for s in self.sessions.values()
                    if s.agent_id == agent_id and (s.pending or s.failing)
                )
            case _:
                pass

    def _project_event(self, project_id: str, data: DomainEvent, changes: Changes) -> None:
        project = self.projects.setdefault(project_id, ProjectInfo())
        match data:
            case ProjectCreated():
                project.limits = data.limits
            case ProjectLimitsChanged():
                project.limits = data.limits
                changes.freed = True
            case RuntimeProfileSet():
                project.profiles[data.name] = data.spec
                changes.pools_moved = True
            case RuntimeProfileRemoved():
                project.profiles.pop(data.name, None)
                changes.pools_moved = True
            case _:
                pass


def _json_bytes(payload: dict[str, Any]) -> int:
    """The bytes of `payload` as JSON. orjson refuses what the log may hold (an integer past
    64 bits, which the API's encoder took): a fold that raised on it stopped every replica,
    on every restart."""
    try:
        return len(orjson.dumps(payload))
    except TypeError:
        return len(json.dumps(payload))


def _wind_down(activation: Activation) -> None:
    """`activation` is cancel-requested: it holds its capacity until it ends."""
    activation.cancel_requested = True
