"""Review findings on the kubernetes backend, against the FAKE Kubernetes API server of
`suzumio.testing.fake_kubernetes` (no cluster exists here; DESIGN.md §13), set up as
tests/integration/test_kubernetes_backend.py does: the real kubernetes-asyncio client over
HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from suzumio.contracts.ids import new_id
from suzumio.orchestrator.backends.base import Exit
from suzumio.orchestrator.backends.kubernetes import KubernetesBackend
from suzumio.orchestrator.backends.kubernetes_render import render
from suzumio.testing.fake_kubernetes import FakeKubernetesServer
from tests.integration.test_kubernetes_backend import NS, plan_in, settings_for


@pytest_asyncio.fixture
async def server() -> AsyncIterator[FakeKubernetesServer]:
    async with FakeKubernetesServer(namespaces=[NS]) as fake:
        yield fake


@pytest.fixture
def platform_ns() -> str:
    return f"t{new_id()[-12:]}"


async def test_fake_api_a_launch_cut_short_before_the_resume_does_not_hang_the_watch(
    server, platform_ns
):
    """Against the fake API server: the orchestrator died after creating the Job (suspended)
    and before resuming it. Found again by `list_live`, that Job never runs (its deadline does
    not count while it is suspended, its TTL never starts): the watch must end it at once —
    nothing ran, retryable — rather than wait for the wall clock, or forever."""
    settings = settings_for(server)
    plan = plan_in(platform_ns)
    job, *_ = render(plan, settings, namespace=platform_ns)
    first = KubernetesBackend(settings, platform_ns)
    try:
        api = await first._client()
        await first._create_job(api, job, plan.activation_id)  # then the crash
    finally:
        await first.close()

    restarted = KubernetesBackend(settings, platform_ns)
    try:
        [found] = await restarted.list_live()
        assert found.finished  # nothing runs: a reconciling leader must not "stop" it
        result = await asyncio.wait_for(restarted.watch(found), 5)
        assert (result.code, result.reason, result.retryable) == (None, "lost", True)
        assert "launch" in result.detail
        await restarted.cleanup(found, succeeded=False)
    finally:
        await restarted.close()
    assert server.objects("Job", NS) == []


async def test_fake_api_a_job_that_gets_no_pod_fails_after_the_unschedulable_grace(
    server, platform_ns
):
    """Against the fake API server, which has no Job controller: the pod is deleted behind
    the backend's back and none replaces it, as when the Job controller cannot create one (a
    ResourceQuota, Pod Security admission refusing hostPath, a webhook). The Job gets no
    condition for that — only `FailedCreate` events — so the watch used to wait for the
    Job's deadline (the whole wall clock) and report a bare timeout."""
    backend = KubernetesBackend(settings_for(server, unschedulable_grace_seconds=2), platform_ns)
    try:
        handle = await backend.launch(plan_in(platform_ns))
        [pod] = server.objects("Pod", NS)
        api = await backend._client()
        await client.CoreV1Api(api).delete_namespaced_pod(pod["metadata"]["name"], NS)
        task = asyncio.create_task(backend.watch(handle))
        await asyncio.sleep(1)
        assert not task.done()  # within its grace: the controller may be slow
        result = await asyncio.wait_for(task, 8)
    finally:
        await backend.close()
    assert (result.code, result.reason, result.retryable) == (None, "lost", True)
    assert "no pod" in result.detail
    [job] = server.objects("Job", NS)
    assert job["spec"]["suspend"] is True  # stopped: the controller tries no more
    assert job["metadata"]["annotations"]["suzumio.io/stopped"] == result.detail


async def test_fake_api_a_pod_that_appears_late_is_not_given_up(server, platform_ns):
    """Against the fake API server: no pod for a while, then one (a slow controller, a quota
    freed): the Job runs as its runner does."""
    backend = KubernetesBackend(settings_for(server, unschedulable_grace_seconds=2), platform_ns)
    try:
        handle = await backend.launch(plan_in(platform_ns))
        [pod] = server.objects("Pod", NS)
        api = await backend._client()
        await client.CoreV1Api(api).delete_namespaced_pod(pod["metadata"]["name"], NS)
        task = asyncio.create_task(backend.watch(handle))
        await asyncio.sleep(1)
        server.finish_job(handle.sandbox_id, 0)  # makes its pod, runs it, ends it
        assert await asyncio.wait_for(task, 5) == Exit(0, "exited", "Completed")
    finally:
        await backend.close()
