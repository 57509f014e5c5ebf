"""Every scheduling rule of DESIGN.md §6, table-driven against the pure policy."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from suzumio.contracts.values import ActivationReason as Reason
from suzumio.contracts.values import Priority, SignalKind
from suzumio.scheduler.domain import policy
from suzumio.scheduler.domain.model import Activation, Ended, Failing, SessionSchedule, Signal
from suzumio.scheduler.domain.policy import Plan, Settings, Start

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
SOON = NOW + timedelta(minutes=5)


def sig(
    signal_id: str,
    priority: str = "P1",
    seq: int = 1,
    *,
    kind: SignalKind = SignalKind.USER_MESSAGE,
    not_before: datetime | None = None,
    failures: int = 0,
) -> Signal:
    return Signal(
        signal_id, kind, Priority(priority), seq, not_before=not_before, failures=failures
    )


@dataclass
class Case:
    pending: list[Signal] = field(default_factory=list)
    live: list[Signal] | None = None  # the live activation's signals, if one runs
    startable: bool = True
    backoff_until: datetime | None = None
    failing: list[str] = field(default_factory=list)
    max_batch: int = 64

    def session(self) -> SessionSchedule:
        s = SessionSchedule("s", "p", "a", opened=True)
        s.pending = {x.id: x for x in self.pending}
        if self.live is not None:
            s.live = Activation("live", "s", "p", "process", 1, Reason.SIGNALS, list(self.live))
        s.backoff_until = self.backoff_until
        s.failing = {i: Failing(sig(i), "model down (3 attempts)") for i in self.failing}
        return s


def start(*ids: str, reason: Reason = Reason.SIGNALS, attempt: int = 1) -> Start:
    return Start(ids, reason, attempt)


CASES = {
    "nothing pending, nothing to do": (Case(), Plan()),
    "a P1 with no live activation starts one": (
        Case(pending=[sig("m1")]),
        Plan(start=start("m1")),
    ),
    "a start delivers P0, P1, P2, P3, each oldest first": (
        Case(
            pending=[
                sig("p3", "P3", 1),
                sig("p2b", "P2", 5),
                sig("p1", "P1", 6),
                sig("p2a", "P2", 2),
                sig("p0", "P0", 9),
            ]
        ),
        Plan(start=start("p0", "p1", "p2a", "p2b", "p3")),
    ),
    "P2 and P3 alone also start an idle session": (
        Case(pending=[sig("t", "P3", kind=SignalKind.CUSTOM)]),
        Plan(start=start("t")),
    ),
    "a P1 waits for the live activation's next tool boundary": (
        Case(pending=[sig("m2")], live=[sig("m1")]),
        Plan(),
    ),
    "P2 and P3 wait for the live activation to finish": (
        Case(pending=[sig("a", "P2"), sig("b", "P3", 2)], live=[sig("m1")]),
        Plan(),
    ),
    "a P0 cancels the live activation and restarts with itself first": (
        Case(pending=[sig("stop", "P0", 7), sig("m3", "P1", 6)], live=[sig("m1", "P1", 2)]),
        Plan(cancel="live", start=start("stop", "m3", reason=Reason.PREEMPT)),
    ),
    # Its activation failed on its own, its end folded before the P0 after it started the
    # live one (the replaced one gone already, nothing marks it replaced): it had its turn.
    "a P0 whose activation failed waits for the live one's end, as a requeued one does": (
        Case(pending=[sig("stop", "P0", 7, failures=1)], live=[sig("stop2", "P0", 9)]),
        Plan(),
    ),
    # Stop now all the same: the P0 waits, first, for a reopen or an enable.
    "a P0 on a closed session or a disabled agent's cancels, and starts nothing": (
        Case(pending=[sig("stop", "P0")], live=[sig("m1")], startable=False),
        Plan(cancel="live"),
    ),
    "a closed session or disabled agent starts nothing": (
        Case(pending=[sig("m1")], startable=False),
        Plan(),
    ),
    "a delayed signal waits for its time": (
        Case(pending=[sig("later", not_before=SOON)]),
        Plan(wake_at=SOON),
    ),
    "a delayed signal does not hold back a due one": (
        Case(pending=[sig("later", seq=1, not_before=SOON), sig("now", seq=2)]),
        Plan(start=start("now"), wake_at=SOON),
    ),
    "after a failure the session backs off": (
        Case(pending=[sig("m1", failures=1)], backoff_until=SOON),
        Plan(wake_at=SOON),
    ),
    "a P0 does not wait out a backoff": (
        Case(pending=[sig("m1", failures=1), sig("stop", "P0", 2)], backoff_until=SOON),
        Plan(start=start("stop", "m1", reason=Reason.RETRY, attempt=2)),
    ),
    "a P0 that failed already waits out the backoff as the rest do": (
        Case(pending=[sig("m1", failures=1), sig("stop", "P0", 2, failures=1)], backoff_until=SOON),
        Plan(wake_at=SOON),
    ),
    "a retry says so and counts its attempt": (
        Case(pending=[sig("m1", failures=2), sig("m2", seq=2)]),
        Plan(start=start("m1", "m2", reason=Reason.RETRY, attempt=3)),
    ),
    "a batch of nudges only is a nudge activation": (
        Case(pending=[sig("n", "P2", kind=SignalKind.NUDGE)]),
        Plan(start=start("n", reason=Reason.NUDGE)),
    ),
    "a start takes at most max_batch signals, the most urgent": (
        Case(pending=[sig(f"m{i}", "P3", i) for i in range(5)] + [sig("x", "P1", 9)], max_batch=3),
        Plan(start=start("x", "m0", "m1")),
    ),
    "spent signals are closed as failed, whatever else happens": (
        Case(failing=["f1"], pending=[sig("m2")], live=[sig("m1")]),
        Plan(close_failed=(("f1", "model down (3 attempts)"),)),
    ),
}


@pytest.mark.parametrize(("case", "expected"), list(CASES.values()), ids=list(CASES))
def test_decide(case: Case, expected: Plan) -> None:
    plan = policy.decide(
        case.session(), NOW, startable=case.startable, settings=Settings(case.max_batch)
    )
    assert plan == expected


def long_sig(signal_id: str, seq: int) -> Signal:
    return Signal(signal_id, SignalKind.USER_MESSAGE, Priority.P1, seq, text_at=seq)


def sig_with_text(signal_id: str, seq: int, text: str) -> Signal:
    return Signal(signal_id, SignalKind.USER_MESSAGE, Priority.P1, seq, text=text)


HANDOVER = {
    "due P1 signals go to the live activation, oldest first": (
        Case(pending=[sig("b", seq=5), sig("a", seq=3), sig("u", "P2", 1)], live=[]),
        "live",
        ["a", "b"],
    ),
    "delayed P1 signals are not handed over early": (
        Case(pending=[sig("later", not_before=SOON)], live=[]),
        "live",
        [],
    ),
    "an activation that is not the live one gets nothing (fenced)": (
        Case(pending=[sig("a")], live=[]),
        "old",
        None,
    ),
    "no live activation: nothing to hand over": (Case(pending=[sig("a")]), "live", None),
    "one long text per handover, the next at the next boundary": (
        Case(pending=[long_sig("l1", 1), sig("s", seq=2), long_sig("l2", 3)], live=[]),
        "live",
        ["l1", "s"],
    ),
    "short texts up to a reply's worth, in order, the first always": (
        Case(pending=[sig_with_text(f"m{n}", n, "漢" * 2_000) for n in range(400)], live=[]),
        "live",
        [f"m{n}" for n in range(policy.HANDOVER_BYTES // 8_002)],  # 4 bytes a char, and "{}"
    ),
}


@pytest.mark.parametrize(
    ("case", "activation", "expected"), list(HANDOVER.values()), ids=list(HANDOVER)
)
def test_handover(case: Case, activation: str, expected: list[str] | None) -> None:
    handed = policy.handover(case.session(), activation, NOW)
    assert (None if handed is None else [x.id for x in handed]) == expected


def ended(
    outcome: str = "completed",
    *,
    useful: bool = False,
    kinds: tuple[SignalKind, ...] = (SignalKind.USER_MESSAGE,),
) -> Ended:
    return Ended("a1", outcome, useful, ("s1",), frozenset(kinds), NOW)  # type: ignore[arg-type]


NUDGE = {
    "work given, nothing done: one nudge": (ended(), True),
    "a useful effect needs no nudge": (ended(useful=True), False),
    "a nudged activation that did nothing is not nudged again": (
        ended(kinds=(SignalKind.NUDGE,)),
        False,
    ),
    "new work beside the nudge counts as work": (
        ended(kinds=(SignalKind.NUDGE, SignalKind.MESSAGE_CREATED)),
        True,
    ),
    "a failed activation is retried, not nudged": (ended("failed"), False),
}


@pytest.mark.parametrize(("ended_", "expected"), list(NUDGE.values()), ids=list(NUDGE))
def test_nudge_rule(ended_: Ended, expected: bool) -> None:
    assert policy.needs_nudge(ended_) is expected
