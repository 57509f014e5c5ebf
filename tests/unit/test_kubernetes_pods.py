"""When the kubernetes backend gives up a pod that will not start (`kubernetes_pods`), on pods as
the API server reports them, with a clock the test moves: no cluster, no API server."""

from __future__ import annotations

from typing import Any

from suzumio.orchestrator.backends.kubernetes_pods import StartCheck


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def waiting(reason: str, uid: str = "p1", message: str = "m") -> dict[str, Any]:
    state = {"waiting": {"reason": reason, "message": message}}
    return {
        "metadata": {"uid": uid},
        "status": {"phase": "Pending", "containerStatuses": [{"name": "runner", "state": state}]},
    }


def unschedulable(uid: str = "p1") -> dict[str, Any]:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    return {"metadata": {"uid": uid}, "status": {"phase": "Pending", "conditions": [condition]}}


def test_what_never_heals_is_given_up_at_once_and_not_retryable() -> None:
    check = StartCheck(120, 600, Clock())
    for reason in ("InvalidImageName", "CreateContainerConfigError", "ErrImageNeverPull"):
        stuck = check.check(waiting(reason, message="bad"))
        assert stuck is not None
        assert (stuck.reason, stuck.retryable) == (reason, False)
        assert stuck.exit().detail == f"the pod did not start: {reason}: bad"
    assert check.check(waiting("ContainerCreating")) is None  # a slow pull is no failure


def test_a_failed_pull_gets_its_grace_across_back_off_and_retry() -> None:
    clock = Clock()
    check = StartCheck(120, 600, clock)
    assert check.check(waiting("ErrImagePull")) is None
    assert check.next_deadline_in() == 120
    clock.now += 119
    assert check.check(waiting("ImagePullBackOff")) is None  # the same failure, counted on
    clock.now += 1
    stuck = check.check(waiting("ImagePullBackOff"))
    assert stuck is not None
    assert stuck.retryable


def test_a_grace_starts_over_once_the_condition_passed() -> None:
    clock = Clock()
    check = StartCheck(120, 600, clock)
    assert check.check(waiting("ErrImagePull")) is None
    clock.now += 100
    running = {"metadata": {"uid": "p1"}, "status": {"phase": "Pending"}}
    assert check.check(running) is None
    assert check.next_deadline_in() is None
    clock.now += 100
    assert check.check(waiting("ErrImagePull")) is None  # a new failure: a whole new grace


def test_an_unschedulable_pod_has_its_own_grace_and_a_gone_pod_is_forgotten() -> None:
    clock = Clock()
    check = StartCheck(120, 600, clock)
    assert check.check_all([unschedulable()]) is None
    clock.now += 599
    assert check.check_all([unschedulable()]) is None
    assert check.check_all([]) is None  # deleted: its count goes with it
    assert check.next_deadline_in() is None
    assert check.check_all([unschedulable("p2")]) is None
    clock.now += 600
    stuck = check.check_all([unschedulable("p2")])
    assert stuck is not None
    assert (stuck.reason, stuck.retryable) == ("Unschedulable", True)
