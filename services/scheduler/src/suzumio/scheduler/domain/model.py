"""What the scheduler knows, per session and across them, folded from the log.

Every session ever opened stays in the fold (a closed one may be reopened, and its next signal
needs its project and agent), so what one costs is kept small: slotted records, and an ended
activation's summary forgotten once it is past the review window (`World.forget_ended`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from suzumio.contracts.values import ActivationReason, Priority, SignalKind

RANK = {Priority.P0: 0, Priority.P1: 1, Priority.P2: 2, Priority.P3: 3}
EndOutcome = Literal["completed", "failed", "cancelled", "timed_out"]


@dataclass(slots=True)
class Signal:
    id: str
    kind: SignalKind
    priority: Priority
    seq: int  # where it was recorded in the log: the order within a priority
    recorded_at: datetime | None = None
    not_before: datetime | None = None
    message_id: str | None = None
    text: str | None = None  # the message's text, for message signals (a short one)
    # A long text is not kept: every replica holds every pending signal, of closed sessions
    # too. It is read from the log when handed over: the commit at this sequence holds it.
    text_at: int | None = None
    payload: dict[str, Any] = field(default_factory=dict)
    # A large payload is not kept either (a project's members may record signals of 256 KiB
    # each, due in years): read from the commit at this sequence when handed over.
    payload_at: int | None = None
    payload_size: int = 0  # its JSON's bytes, for the handover's budget
    failures: int = 0  # failed activations it was part of
    # Queued again after the activation it went to was replaced by a P0 (or cancelled): a P0
    # among these has had its preemption, and waits for the next start like the rest. Were
    # it to preempt again, two P0s in a row would cancel each other's activations forever.
    requeued: bool = False

    def __post_init__(self) -> None:
        # The API once let a timezone-naive `not_before` into the log, and comparing one with
        # the aware clock raises: read it as UTC, so an old event cannot halt the fold.
        if self.not_before is not None and self.not_before.tzinfo is None:
            self.not_before = self.not_before.replace(tzinfo=UTC)

    @property
    def order(self) -> tuple[int, int]:
        return RANK[self.priority], self.seq

    def due(self, now: datetime) -> bool:
        return self.not_before is None or self.not_before <= now

    @property
    def preempts(self) -> bool:
        """A fresh P0: it cancels the live activation and starts the next one. Not once it
        was delivered: requeued from a replaced activation, or back from one that failed
        (whose end may fold after the P0 behind it started the live one)."""
        return self.priority is Priority.P0 and not self.requeued and self.failures == 0


@dataclass(slots=True)
class Activation:
    id: str
    session_id: str
    project_id: str
    pool: str
    attempt: int
    reason: ActivationReason
    signals: list[Signal]  # its start batch, then what was handed over at tool boundaries
    handed: list[str] = field(default_factory=list)  # ids handed over while it ran
    cancel_requested: bool = False
    # A P0's replacement: the activation it replaced, while that one is still winding down.
    replaced: str | None = None
    started: bool = False
    useful: bool = False  # wrote a message, finished a tool call well, or produced output
    read_only_calls: set[str] = field(default_factory=set)  # their success is no effect


@dataclass(frozen=True, slots=True)
class Ended:
    """The last activation of a session that ended, for the hooks and the nudge rule."""

    activation_id: str
    outcome: EndOutcome
    useful: bool
    signal_ids: tuple[str, ...]
    kinds: frozenset[SignalKind]
    at: datetime


@dataclass(slots=True)
class Failing:
    """A signal whose retry budget is spent (or whose activation cannot be retried): it is
    closed as failed with `reason`."""

    signal: Signal
    reason: str


@dataclass(slots=True)
class SessionSchedule:
    id: str
    project_id: str = ""
    agent_id: str = ""
    opened: bool = False
    closed: bool = False
    version: int = 0  # the head of the session's subject: appends are conditional on it
    seq: int = 0
    pending: dict[str, Signal] = field(default_factory=dict)
    live: Activation | None = None  # requested or running, not cancel-requested
    failing: dict[str, Failing] = field(default_factory=dict)
    consecutive_failures: int = 0
    backoff_until: datetime | None = None
    last_ended: Ended | None = None
    reviewed: str | None = None  # the ended activation the hooks and nudge rule last saw

    def due_signals(self, now: datetime) -> list[Signal]:
        return sorted((s for s in self.pending.values() if s.due(now)), key=lambda s: s.order)

    def next_due(self, now: datetime) -> datetime | None:
        later = [s.not_before for s in self.pending.values() if s.not_before and s.not_before > now]
        return min(later, default=None)


@dataclass(slots=True)
class AgentInfo:
    project_id: str
    runtime_profile: str | None = None
    disabled: bool = False
    toolpacks: tuple[str, ...] = ()  # a toolpack's own scheduler hooks see only its agents
