"""Review fixes of the docker and kubernetes backends (AREA=backends).

The docker tests run against the machine's real engine and runner image (the fixtures of
tests/integration/test_docker_backend.py); the kubernetes tests run against a FAKE Kubernetes
API server (`suzumio.testing.fake_kubernetes`; no cluster exists here)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import requests

from suzumio.orchestrator.backends.base import LaunchError
from suzumio.orchestrator.backends.kubernetes import KubernetesBackend, KubernetesSettings
from suzumio.testing import fake_kubernetes
from suzumio.testing.fake_kubernetes import FakeKubernetesServer
from tests.integration import test_docker_backend as docker_suite
from tests.integration.test_docker_backend import SLEEP, make_plan
from tests.unit.test_kubernetes_render import make_plan as k8s_plan

# The docker suite's fixtures: the real engine, the runner image, backends cleaned up after.
image = docker_suite.image
engine = docker_suite.engine
make_backend = docker_suite.make_backend

pytestmark = pytest.mark.timeout(300)
K8S_NS = "sandboxes"


async def test_docker_a_start_whose_answer_is_lost_leaves_no_container(
    make_backend, engine, tmp_path, monkeypatch
):
    """The engine started the container but its answer never came (a read timeout): the
    launch fails (retryable) and must not leave a sandbox running that nobody watches — the
    activation ends as failed and is retried as another one, while this one would run on with
    its token until a new leader happened to reconcile."""
    backend = make_backend()
    plan = make_plan(tmp_path, entry=SLEEP)
    real_client = backend._client

    def client() -> Any:
        api = real_client()
        start = api.start

        def start_then_lose_the_answer(container: str) -> None:
            start(container)
            raise requests.exceptions.ReadTimeout("read timed out (a test)")

        monkeypatch.setattr(api, "start", start_then_lose_the_answer)
        return api

    monkeypatch.setattr(backend, "_client", client)
    with pytest.raises(LaunchError) as failed:
        await backend.launch(plan)
    assert failed.value.retryable
    label = f"io.suzumio.activation={plan.activation_id}"
    assert engine.containers(all=True, filters={"label": label}) == []


async def test_docker_a_wait_cut_midway_is_waited_again_not_taken_for_a_lost_sandbox(
    make_backend, engine, tmp_path, monkeypatch
):
    """The engine answers a wait's head at once and its body when the container exits: a
    connection cut in between (dockerd restarting with live-restore, the socket dropped) ends
    the body early, which requests raises as ChunkedEncodingError — no ConnectionError. It is
    the engine out of reach for a moment, like any other: the watch waits again, and the
    running container is neither stopped nor reported lost."""
    backend = make_backend()
    plan = make_plan(tmp_path, entry=("python3", "-c", "import time; time.sleep(3)"))
    handle = await backend.launch(plan)
    real_client = backend._wait_client
    cuts: list[str] = []

    def client() -> Any:
        api = real_client()
        if cuts:
            return api

        def cut_wait(container: str, timeout: float) -> None:
            cuts.append(container)
            raise requests.exceptions.ChunkedEncodingError("connection broken (a test)")

        class Cut:
            def __getattr__(self, name: str) -> Any:
                return cut_wait if name == "wait" else getattr(api, name)

        return Cut()

    monkeypatch.setattr(backend, "_wait_client", client)
    exit_ = await asyncio.wait_for(backend.watch(handle), 60)
    assert cuts == [handle.sandbox_id]
    assert (exit_.code, exit_.reason) == (0, "exited"), exit_


async def test_docker_launches_and_stops_do_not_queue_behind_running_containers_waits(
    make_backend, engine, tmp_path
):
    """Each running container's wait holds a thread for 5 s at a time, over and over. With
    two threads for calls and four containers running (and watched), a fifth launches and
    one is stopped while they run: on the calls' own threads, each call of the launch queued
    behind the waits (~5-10 s a call, several calls), here it goes at once. (The bound is a
    wait's slice: a liveness check, not a figure.)"""
    backend = make_backend(max_threads=2)
    plans = [make_plan(tmp_path / f"p{n}", entry=SLEEP) for n in range(5)]
    handles = [await backend.launch(plan) for plan in plans[:4]]
    watches = [asyncio.create_task(backend.watch(handle)) for handle in handles]
    try:
        await asyncio.sleep(1.0)  # the four waits are on their threads
        # Both well within one wait's slice: on the calls' threads they took 12-30 s here.
        fifth = await asyncio.wait_for(backend.launch(plans[4]), 8)
        await asyncio.wait_for(backend.cancel(handles[0]), 8)
        stopped = await asyncio.wait_for(watches[0], 60)
        assert stopped.reason == "cancelled", stopped
        assert not any(w.done() for w in watches[1:])
        handles.append(fifth)
    finally:
        for handle in handles:
            with contextlib.suppress(Exception):
                await backend.cancel(handle)
        for watch in watches:
            watch.cancel()


async def test_docker_a_kept_cancelled_container_is_not_remembered_for_ever(
    make_backend, engine, tmp_path
):
    """A cancelled container the cleanup policy keeps (for a person to look at): kept, and
    the backend's note that it was cancelled (which its watch reads) goes — it grew by one
    per cancel for as long as the orchestrator ran."""
    backend = make_backend(cleanup="never")
    handle = await backend.launch(make_plan(tmp_path, entry=SLEEP))
    watching = asyncio.create_task(backend.watch(handle))
    await backend.cancel(handle)
    assert (await asyncio.wait_for(watching, 60)).reason == "cancelled"
    await backend.cleanup(handle, succeeded=False)
    assert engine.inspect_container(handle.sandbox_id)["State"]["Status"] == "exited"
    assert handle.sandbox_id not in backend._cancelled
    engine.remove_container(handle.sandbox_id, force=True)


# -- kubernetes, against a FAKE Kubernetes API server ------------------------------------------


@pytest_asyncio.fixture
async def k8s_1_26(monkeypatch) -> AsyncIterator[FakeKubernetesServer]:
    """A FAKE Kubernetes API server labelling a Job's pods as 1.26 did: `job-name` and
    `controller-uid` only (`batch.kubernetes.io/job-name` came with 1.27)."""
    monkeypatch.setattr(fake_kubernetes, "_JOB_NAME_LABELS", ("job-name",))
    monkeypatch.setattr(fake_kubernetes, "_UID_LABELS", ("controller-uid",))
    async with FakeKubernetesServer(namespaces=[K8S_NS], git_version="v1.26.15") as fake:
        yield fake


def k8s_backend(server: FakeKubernetesServer) -> KubernetesBackend:
    settings = KubernetesSettings(
        namespace=K8S_NS, image="suzumio/runner:test", api_url=server.url, watch_timeout_seconds=5
    )
    return KubernetesBackend(settings, "review")


async def test_fake_api_the_pod_is_found_without_the_1_27_job_label(k8s_1_26):
    """Against a FAKE Kubernetes API server (1.26 pod labels): the watch finds the Job's pod
    by a label of the backend's own, so the container's real end is read (OOM, not lost)."""
    backend = k8s_backend(k8s_1_26)
    try:
        handle = await backend.launch(k8s_plan(namespace="review"))
        k8s_1_26.finish_job(handle.sandbox_id, 137, reason="OOMKilled")
        result = await asyncio.wait_for(backend.watch(handle), 10)
    finally:
        await backend.close()
    assert (result.code, result.reason) == (137, "oom")


async def test_fake_api_a_pod_that_cannot_start_is_seen_without_the_1_27_job_label(k8s_1_26):
    """Against a FAKE Kubernetes API server (1.26 pod labels): an invalid image ends the
    activation at once, not after the Job's deadline (an hour, as a retryable timeout)."""
    backend = k8s_backend(k8s_1_26)
    try:
        handle = await backend.launch(k8s_plan(namespace="review"))
        k8s_1_26.stall_pod(handle.sandbox_id, "InvalidImageName", "bad name")
        result = await asyncio.wait_for(backend.watch(handle), 10)
    finally:
        await backend.close()
    assert (result.code, result.reason, result.retryable) == (None, "lost", False)
