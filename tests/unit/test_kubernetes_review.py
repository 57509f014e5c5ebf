"""Review findings on the kubernetes backend's pure parts (`kubernetes_pods`, `job_outcome`):
pods and Jobs as the API server reports them, a clock the test moves; no cluster, no API
server (the integration counterparts, in tests/integration/test_kubernetes_review.py, use the
FAKE Kubernetes API server)."""

from __future__ import annotations

from suzumio.orchestrator.backends.kubernetes import exit_from, job_outcome
from suzumio.orchestrator.backends.kubernetes_pods import NO_POD, StartCheck
from tests.unit.test_kubernetes_pods import Clock, waiting


def test_a_job_without_any_pod_is_given_up_after_the_unschedulable_grace() -> None:
    clock = Clock()
    check = StartCheck(120, 600, clock)
    assert check.check_all([]) is None
    assert check.no_pod_deadline_in() == 600  # the pod watch ends in time to look again
    clock.now += 599
    assert check.check_all([]) is None
    clock.now += 1
    stuck = check.check_all([])
    assert stuck is not None
    assert (stuck.reason, stuck.retryable) == (NO_POD, True)
    assert "no pod was created for the Job in 600 s" in stuck.exit().detail


def test_a_pod_that_appears_resets_the_no_pod_count() -> None:
    clock = Clock()
    check = StartCheck(120, 600, clock)
    assert check.check_all([]) is None
    clock.now += 500
    assert check.check_all([waiting("ContainerCreating")]) is None  # the controller made it
    assert check.no_pod_deadline_in() is None
    clock.now += 200
    assert check.check_all([]) is None  # gone again (deleted): a whole grace again
    clock.now += 599
    assert check.check_all([]) is None


def test_a_suspended_job_that_no_watch_stopped_is_a_launch_cut_short() -> None:
    job = {"metadata": {"annotations": {}}, "spec": {"suspend": True}, "status": {}}
    outcome = job_outcome(job)
    assert outcome is not None
    result = exit_from(outcome, None)
    assert (result.code, result.reason, result.retryable) == (None, "lost", True)
    assert "launch did not finish" in result.detail
    running = {"metadata": {}, "spec": {"suspend": False}, "status": {"active": 1}}
    assert job_outcome(running) is None
