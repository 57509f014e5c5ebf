"""A timezone-naive `not_before` that reached the log before the API refused them must not
halt the scheduler's fold or its decisions: it is read as UTC."""

from __future__ import annotations

from datetime import UTC, timedelta

from suzumio.contracts.events import SignalRecorded
from suzumio.contracts.values import Priority, SignalKind
from suzumio.scheduler.domain import policy
from suzumio.scheduler.domain.model import SessionSchedule, Signal
from suzumio.scheduler.timers import Timers
from tests.unit.test_scheduling_state import T0, opened

LATER = (T0 + timedelta(hours=1)).replace(tzinfo=None)


def timer(signal_id: str, **extra: object) -> SignalRecorded:
    return SignalRecorded.model_validate(
        {
            "signal_id": signal_id,
            "agent_id": "a",
            "kind": SignalKind.TIMER,
            "priority": Priority.P3,
            **extra,
        }
    )


def test_a_naive_not_before_in_the_log_is_read_as_utc() -> None:
    world, log = opened()
    log.append("s", timer("late", not_before=LATER), timer("now"))
    s = world.sessions["s"]
    assert s.pending["late"].not_before == LATER.replace(tzinfo=UTC)
    plan = policy.decide(s, T0, startable=True, settings=policy.Settings())
    assert plan.start is not None
    assert plan.start.signal_ids == ("now",)
    assert plan.wake_at == T0 + timedelta(hours=1)
    timers = Timers()
    timers.add(T0 + timedelta(minutes=1), "other")
    assert plan.wake_at is not None
    timers.add(plan.wake_at, "s")  # an aware deadline: comparable with the others
    after = policy.decide(s, T0 + timedelta(hours=2), startable=True, settings=policy.Settings())
    assert after.start is not None
    assert sorted(after.start.signal_ids) == ["late", "now"]


def test_a_signal_built_with_a_naive_time_compares_with_aware_ones() -> None:
    s = SessionSchedule("s", "p", "a", opened=True)
    s.pending = {"x": Signal("x", SignalKind.TIMER, Priority.P3, 1, not_before=LATER)}
    assert s.due_signals(T0) == []
    assert s.next_due(T0) == T0 + timedelta(hours=1)
    assert [x.id for x in s.due_signals(T0 + timedelta(hours=1))] == ["x"]
