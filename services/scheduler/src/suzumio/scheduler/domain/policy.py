"""The rules of DESIGN.md §6 as pure functions: given one session's state and the time, what to
do now. Capacity (project and pool limits, round-robin across projects) is decided around
these, in `admission`; hooks and the nudge rule run where an activation ended."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from suzumio.contracts.values import ActivationReason, Priority, SignalKind
from suzumio.scheduler.domain.model import Ended, SessionSchedule, Signal


@dataclass(frozen=True)
class Settings:
    max_batch: int = 64  # signals one activation starts with


@dataclass(frozen=True)
class Start:
    signal_ids: tuple[str, ...]  # in delivery order: P0 first, then P1, P2, P3, each by age
    reason: ActivationReason
    attempt: int


@dataclass(frozen=True)
class Plan:
    """What to do for a session now. `start` with `cancel` is a P0 replacing the live
    activation (no capacity needed: it takes the old one's place); `start` alone must first be
    admitted under the limits."""

    close_failed: tuple[tuple[str, str], ...] = ()  # (signal id, reason)
    cancel: str | None = None
    start: Start | None = None
    wake_at: datetime | None = None  # look again then (a delayed signal, a backoff's end)


# Signals closed as failed in one decision: one append holds at most 1,000 events, and a
# failed activation may have been handed any number of P1s. The rest close in the next ones
# (each decision's append, once folded, has the session looked at again).
MAX_CLOSES_PER_DECISION = 200
HANDOVER_BYTES = 2 << 20  # the short texts (and payloads) of one handover, together


def decide(s: SessionSchedule, now: datetime, *, startable: bool, settings: Settings) -> Plan:
    close = tuple((f.signal.id, f.reason) for f in s.failing.values())[:MAX_CLOSES_PER_DECISION]
    due = s.due_signals(now)
    wake = s.next_due(now)
    if s.live is not None:
        if not any(x.preempts for x in due) or s.live.replaced is not None:
            # P1 waits for a tool boundary; P2, P3 and a requeued P0 for the end. A fresh P0
            # waits while the activation the live one replaced (by a P0) is still winding
            # down: a replacement takes no admission, and P0 after P0 would otherwise put the
            # project one over its limit per message, without bound. One that a user's cancel
            # left winding down was counted when the live one was admitted: no wait for it.
            return Plan(close, wake_at=wake)
        if not startable:
            # A P0 is "stop now" (DESIGN §6): the live activation goes, though nothing starts
            # in its place until a reopen or an enable — the P0 waits for that, first.
            return Plan(close, cancel=s.live.id, wake_at=wake)
        # The replaced activation's own signals are not carried over: it may yet finish (its
        # end is not ordered with this decision); if it ends cancelled, they queue again, and
        # do not preempt the activation that replaced it.
        # The P0s that preempt go first: requeued ones (older) must not crowd them out of the
        # batch, or the next decision would preempt the activation that just started.
        ordered = [x for x in due if x.preempts] + [x for x in due if not x.preempts]
        batch = ordered[: settings.max_batch]
        start = Start(tuple(x.id for x in batch), ActivationReason.PREEMPT, 1)
        return Plan(close, cancel=s.live.id, start=start, wake_at=wake)
    if not startable or not due:
        return Plan(close, wake_at=wake)
    # A fresh P0 (a user's stop, never tried) does not wait out the backoff; one that failed
    # already does, as the rest: else each of its failures starts the batch again at once,
    # and a provider's outage closes every signal in it within seconds, not over the backoff.
    urgent = any(x.preempts for x in due)
    if s.backoff_until is not None and now < s.backoff_until and not urgent:
        return Plan(close, wake_at=_earliest(wake, s.backoff_until))
    batch = due[: settings.max_batch]
    attempt = 1 + max(x.failures for x in batch)
    if attempt > 1:
        reason = ActivationReason.RETRY
    elif all(x.kind is SignalKind.NUDGE for x in batch):
        reason = ActivationReason.NUDGE
    else:
        reason = ActivationReason.SIGNALS
    return Plan(close, start=Start(tuple(x.id for x in batch), reason, attempt), wake_at=wake)


def handover(s: SessionSchedule, activation_id: str, now: datetime) -> list[Signal] | None:
    """The P1 signals to hand to the live activation at its tool boundary; None when that
    activation is not the session's live one (it ended, or a P0 replaced it: fenced)."""
    if s.live is None or s.live.id != activation_id:
        return None
    return _within_a_reply([x for x in s.due_signals(now) if x.priority is Priority.P1])


def _within_a_reply(signals: list[Signal]) -> list[Signal]:
    """The first of `signals`, in order, whose texts one reply can carry (a bus message, of
    at most 8 MB): at most one long text (read from the log: up to a million characters, 4
    bytes each at worst) and short ones up to `HANDOVER_BYTES`; the first always. The rest
    go at the next tool boundary. (All at once, three long messages made a reply too large
    to send after their delivery was recorded — and every retry of the runner failed alike.)"""
    taken: list[Signal] = []
    budget, long_taken = HANDOVER_BYTES, False
    for signal in signals:
        if signal.text_at is not None:
            if long_taken:
                break
            long_taken, size = True, 0  # bounded by a message's own limit, counted apart
        else:
            size = 4 * len(signal.text or "") + (signal.payload_size or len(repr(signal.payload)))
        if taken and size > budget:
            break
        taken.append(signal)
        budget -= size
    return taken


def needs_nudge(ended: Ended) -> bool:
    """One nudge for an activation that ended without any useful effect although it was given
    work; never for one that was itself only nudged, so nudges cannot loop.

    That work is the "work still pending" of DESIGN.md §6: a signal is a unit of pending work,
    and a delivered one has no state of its own saying it was done — only an effect does. So
    the work of an activation that had none is still pending, whatever else waits (signals
    still queued start the next activation anyway; the nudge tells it the last one did
    nothing)."""
    worked_on = ended.kinds - {SignalKind.NUDGE}
    return ended.outcome == "completed" and not ended.useful and bool(worked_on)


def _earliest(a: datetime | None, b: datetime) -> datetime:
    return b if a is None else min(a, b)
