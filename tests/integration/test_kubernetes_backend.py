"""The kubernetes backend against a FAKE Kubernetes API server (`suzumio.testing.fake_kubernetes`,
no cluster exists here; DESIGN.md §13): the real kubernetes-asyncio client over HTTP, the Job
and its pod ended by the fake's test controls."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import os
import socket
import stat
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from suzumio.contracts.ids import new_id
from suzumio.contracts.values import NetworkProfile
from suzumio.orchestrator.backends import kubernetes as kubernetes_backend
from suzumio.orchestrator.backends.base import Exit, Handle, LaunchError, LaunchPlan
from suzumio.orchestrator.backends.kubernetes import KubernetesBackend, KubernetesSettings
from suzumio.testing.fake_kubernetes import ApiError, FakeKubernetesServer
from tests.unit.test_kubernetes_render import PROVIDER_KEY, TOKEN, make_plan

NS = "sandboxes"
KINDS = ("Job", "Secret", "ConfigMap", "NetworkPolicy")


@pytest_asyncio.fixture
async def server() -> AsyncIterator[FakeKubernetesServer]:
    async with FakeKubernetesServer(namespaces=[NS, "default"]) as fake:
        yield fake


def settings_for(server: FakeKubernetesServer, **overrides: Any) -> KubernetesSettings:
    base: dict[str, Any] = {
        "namespace": NS,
        "image": "suzumio/runner:test",
        "api_url": server.url,
        "watch_timeout_seconds": 5,
    }
    return KubernetesSettings(**(base | overrides))


@pytest.fixture
def platform_ns() -> str:
    return f"t{new_id()[-12:]}"


@pytest_asyncio.fixture
async def backend(
    server: FakeKubernetesServer, platform_ns: str
) -> AsyncIterator[KubernetesBackend]:
    backend = KubernetesBackend(settings_for(server), platform_ns)
    yield backend
    await backend.close()


def plan_in(platform_ns: str, **kwargs: Any) -> LaunchPlan:
    return make_plan(namespace=platform_ns, **kwargs)


async def watching(server: FakeKubernetesServer, backend: KubernetesBackend, handle: Handle):
    """`watch` running, once its watch request reached the server."""
    before = sum(1 for r in server.requests if r.query.get("watch") == "True")
    task = asyncio.create_task(backend.watch(handle))
    for _ in range(500):
        if sum(1 for r in server.requests if r.query.get("watch") == "True") > before:
            return task
        await asyncio.sleep(0.01)
    task.cancel()
    raise AssertionError("watch never reached the fake Kubernetes API server")


# -- launch -----------------------------------------------------------------------------------


async def test_launch_creates_the_job_then_its_owned_objects(server, backend, platform_ns):
    plan = plan_in(platform_ns)
    handle = await backend.launch(plan)
    assert handle.backend == "kubernetes"
    assert handle.activation_id == plan.activation_id
    [job] = server.objects("Job", NS)
    assert handle.sandbox_id == job["metadata"]["name"]
    assert handle.data["uid"] == job["metadata"]["uid"]
    assert job["spec"]["suspend"] is False  # resumed once its dependents existed
    writes = [(r.method, r.path.rsplit("/", 1)[-1]) for r in server.requests if r.method != "GET"]
    name = handle.sandbox_id
    assert writes == [
        ("POST", "jobs"),
        ("POST", "secrets"),
        ("POST", "configmaps"),
        ("POST", "networkpolicies"),
        ("PATCH", name),
    ]
    for kind in KINDS[1:]:
        [obj] = server.objects(kind, NS)
        assert obj["metadata"]["name"] == name
        [owner] = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("Job", name, job["metadata"]["uid"])
    for kind in KINDS:
        labels = server.objects(kind, NS)[0]["metadata"]["labels"]
        assert labels["suzumio.io/managed"] == "true"
        assert labels["suzumio.io/namespace"] == platform_ns
        assert labels["suzumio.io/activation"] == plan.activation_id
    pod = job["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    container = pod["containers"][0]["securityContext"]
    assert container["capabilities"] == {"drop": ["ALL"]}
    assert container["allowPrivilegeEscalation"] is False
    assert container["readOnlyRootFilesystem"] is True
    [secret] = server.objects("Secret", NS)
    stored = json.loads(base64.b64decode(secret["data"]["input.json"]))
    assert stored["token"] == TOKEN
    [running] = server.objects("Pod", NS)
    assert running["status"]["phase"] == "Running"


async def test_a_launch_cut_short_whose_job_cannot_be_deleted_yet_deletes_it_later(
    server, backend, platform_ns, monkeypatch
):
    """Its Secret refused (a 500) and the Job's deletion failing too (the API server away
    for a moment): the suspended Job — never to run, finish or expire, its Secret holding
    the token and keys — stayed until a new leader's sweep. It is deleted once it can be."""
    monkeypatch.setattr(kubernetes_backend, "CUT_SHORT_FIRST_RETRY_SECONDS", 0.05, raising=False)

    async def refused(*_: Any) -> None:
        raise client.ApiException(status=500, reason="etcd away")

    monkeypatch.setattr(backend, "_create", refused)
    real_delete = backend._delete_job
    tries: list[str] = []

    async def away_at_first(name: str) -> None:
        tries.append(name)
        if len(tries) < 3:
            raise client.ApiException(status=503, reason="away")
        await real_delete(name)

    monkeypatch.setattr(backend, "_delete_job", away_at_first)
    with pytest.raises(LaunchError):
        await backend.launch(plan_in(platform_ns))
    [job] = server.objects("Job", NS)
    assert job["spec"]["suspend"] is True  # left by the launch, for now
    for _ in range(100):
        if not server.objects("Job", NS):
            break
        await asyncio.sleep(0.05)
    assert server.objects("Job", NS) == []
    assert len(tries) == 3


async def test_a_retried_launch_is_idempotent(server, backend, platform_ns):
    plan = plan_in(platform_ns)
    first = await backend.launch(plan)
    second = await backend.launch(plan)
    assert first == second
    for kind in KINDS:
        assert len(server.objects(kind, NS)) == 1


async def test_launch_failures_are_launch_errors(server, platform_ns):
    missing_ns = KubernetesBackend(settings_for(server, namespace="nowhere"), platform_ns)
    with pytest.raises(LaunchError) as refused:
        await missing_ns.launch(plan_in(platform_ns))
    assert not refused.value.retryable
    assert "nowhere" in str(refused.value)
    no_image = KubernetesBackend(settings_for(server, image=None), platform_ns)
    with pytest.raises(LaunchError) as imageless:
        await no_image.launch(plan_in(platform_ns))
    assert not imageless.value.retryable
    for backend in (missing_ns, no_image):
        await backend.close()
    assert server.objects("Job") == []


# -- watch ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exit_code", "reason", "expected"),
    [
        (0, None, Exit(0, "exited", "Completed")),
        (1, None, Exit(1, "exited", "Error")),
        (137, "OOMKilled", Exit(137, "oom", "the container ran out of memory")),
        # Killed by a signal, not out of memory (a node's shutdown): no code of the runner's
        # own, as the docker backend reads it (it read as a failed exit, its work done again).
        (143, None, Exit(None, "killed")),
        (0, "DeadlineExceeded", Exit(None, "timeout")),
        (0, "Evicted", Exit(None, "killed")),
    ],
)
async def test_watch_turns_the_job_and_pod_into_an_exit(
    server, backend, platform_ns, exit_code, reason, expected
):
    handle = await backend.launch(plan_in(platform_ns))
    task = await watching(server, backend, handle)
    await asyncio.sleep(0.05)
    assert not task.done()
    server.finish_job(handle.sandbox_id, exit_code, reason=reason)
    result = await asyncio.wait_for(task, 10)
    assert (result.code, result.reason) == (expected.code, expected.reason)
    if expected.reason in ("exited", "oom"):
        assert result.detail == expected.detail


async def test_watch_of_a_finished_job_returns_at_once(server, backend, platform_ns):
    handle = await backend.launch(plan_in(platform_ns))
    server.finish_job(handle.sandbox_id, 3)
    assert await asyncio.wait_for(backend.watch(handle), 5) == Exit(3, "exited", "Error")


async def test_watch_polls_when_the_watch_api_fails(server, backend, platform_ns):
    server.fail_watches = True
    handle = await backend.launch(plan_in(platform_ns))
    task = asyncio.create_task(backend.watch(handle))
    await asyncio.sleep(0.5)
    assert not task.done()
    server.finish_job(handle.sandbox_id, 0)
    assert (await asyncio.wait_for(task, 15)).code == 0
    reads = [r for r in server.requests if r.method == "GET" and r.path.endswith(handle.sandbox_id)]
    assert len(reads) >= 2


async def test_watch_of_a_job_deleted_by_someone_else_is_lost(server, backend, platform_ns):
    handle = await backend.launch(plan_in(platform_ns))
    task = await watching(server, backend, handle)
    other = KubernetesBackend(settings_for(server), platform_ns)
    await other.cancel(handle)
    await other.close()
    assert (await asyncio.wait_for(task, 5)).reason == "lost"


# -- pods that never start (a FAKE API server plays kubelet and scheduler: `stall_pod`) ---------


def assert_stopped(server: FakeKubernetesServer, name: str, detail: str) -> None:
    """The Job is suspended (its pod gone: no more pulls, no node's room held) and says why."""
    [job] = server.objects("Job", NS)
    assert job["metadata"]["name"] == name
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["annotations"]["suzumio.io/stopped"] == detail
    assert server.objects("Pod", NS) == []


@pytest.mark.parametrize(
    "reason", ["InvalidImageName", "CreateContainerConfigError", "ErrImageNeverPull"]
)
async def test_fake_api_a_pod_that_can_never_start_fails_at_once(
    server, backend, platform_ns, reason
):
    """Against the fake API server: with backoffLimit 0 such a pod fails nothing until the
    Job's deadline (an hour, then a retryable timeout); the watch ends it with the reason."""
    handle = await backend.launch(plan_in(platform_ns))
    task = await watching(server, backend, handle)
    message = f'couldn\'t parse image name "no such/image": {reason}'
    server.stall_pod(handle.sandbox_id, reason, message)
    result = await asyncio.wait_for(task, 5)
    assert (result.code, result.reason) == (None, "lost")
    assert result.detail == f"the pod did not start: {reason}: {message}"
    assert result.retryable is False  # the same plan would fail the same way
    assert_stopped(server, handle.sandbox_id, result.detail)
    await backend.cleanup(handle, succeeded=False)  # the default policy removes all of it
    assert all(server.objects(kind, NS) == [] for kind in KINDS)


@pytest.mark.parametrize(
    ("reason", "grace"),
    [
        ("ImagePullBackOff", "start_grace_seconds"),
        ("ErrImagePull", "start_grace_seconds"),
        ("CreateContainerError", "start_grace_seconds"),
        ("Unschedulable", "unschedulable_grace_seconds"),
    ],
)
async def test_fake_api_a_pod_stuck_pending_fails_after_its_grace(
    server, platform_ns, reason, grace
):
    """Against the fake API server: a failed pull (or no node) may pass, so the watch waits
    its grace (from the settings) and then gives the pod up; no event is needed to end it."""
    backend = KubernetesBackend(settings_for(server, **{grace: 2}), platform_ns)
    try:
        handle = await backend.launch(plan_in(platform_ns))
        task = await watching(server, backend, handle)
        server.stall_pod(handle.sandbox_id, reason, "rpc error: pull access denied")
        await asyncio.sleep(1)
        assert not task.done()  # within its grace
        result = await asyncio.wait_for(task, 6)
    finally:
        await backend.close()
    assert (result.code, result.reason) == (None, "lost")
    assert result.retryable is True
    assert result.detail == f"the pod did not start: {reason}: rpc error: pull access denied"
    assert_stopped(server, handle.sandbox_id, result.detail)


async def test_fake_api_a_pull_that_fails_then_works_is_not_given_up(server, platform_ns):
    """Against the fake API server: within the grace a failed pull is left alone, and the Job
    ends as its runner does."""
    backend = KubernetesBackend(settings_for(server, start_grace_seconds=3_600), platform_ns)
    try:
        handle = await backend.launch(plan_in(platform_ns))
        task = await watching(server, backend, handle)
        server.stall_pod(handle.sandbox_id, "ImagePullBackOff", "Back-off pulling image")
        await asyncio.sleep(0.5)
        assert not task.done()
        server.finish_job(handle.sandbox_id, 0)
        assert await asyncio.wait_for(task, 5) == Exit(0, "exited", "Completed")
    finally:
        await backend.close()


async def test_fake_api_a_stuck_pod_is_found_by_polling_when_watches_fail(
    server, backend, platform_ns
):
    """Against the fake API server whose watches all fail: the poll reads the pods too."""
    server.fail_watches = True
    handle = await backend.launch(plan_in(platform_ns))
    task = asyncio.create_task(backend.watch(handle))
    await asyncio.sleep(0.3)
    server.stall_pod(handle.sandbox_id, "InvalidImageName", "bad name")
    result = await asyncio.wait_for(task, 10)
    detail = "the pod did not start: InvalidImageName: bad name"
    assert result == Exit(None, "lost", detail, retryable=False)


async def test_fake_api_a_restarted_watch_of_a_stopped_job_ends_as_it_did(
    server, backend, platform_ns
):
    """Against the fake API server: the stopped Job (kept: cleanup `never`) tells a watch
    after an orchestrator restart why it ended, instead of waiting on a suspended Job."""
    handle = await backend.launch(plan_in(platform_ns))
    task = await watching(server, backend, handle)
    server.stall_pod(handle.sandbox_id, "CreateContainerConfigError", 'secret "x" not found')
    first = await asyncio.wait_for(task, 5)
    restarted = KubernetesBackend(settings_for(server, cleanup="never"), platform_ns)
    try:
        [found] = await restarted.list_live()
        assert await asyncio.wait_for(restarted.watch(found), 5) == first
    finally:
        await restarted.close()


# -- host paths -------------------------------------------------------------------------------


@pytest.mark.parametrize("as_root", [True, False])
async def test_fake_api_host_paths_are_made_and_handed_to_the_runner(
    server, platform_ns, tmp_path, monkeypatch, as_root
):
    """Against the fake API server: hostPath ignores fsGroup, so the workspace, its `in`, `out`
    and session mount point and the session's directory are made before the Job and are the
    runner's (chown as root; else the runner runs as the orchestrator's own user, and they
    are its, writable by nobody else — opened to all before, every local user of the node
    could read and write what the agents wrote): made by the kubelet they would be root's."""
    if as_root and os.geteuid() != 0:
        pytest.skip("chown needs root")
    if not as_root:
        monkeypatch.setattr(os, "geteuid", lambda: 1000)  # an orchestrator that is not root
    plan = dataclasses.replace(
        plan_in(platform_ns),
        host_dir=tmp_path / "activations" / "a1",
        session_dir=tmp_path / "sessions" / "s1",
    )
    (plan.host_dir / "workspace").mkdir(parents=True, mode=0o755)
    (plan.host_dir / "workspace" / "left.txt").write_text("from an earlier attempt")
    backend = KubernetesBackend(settings_for(server, host_paths=True), platform_ns)
    try:
        handle = await backend.launch(plan)
    finally:
        await backend.close()
    workspace = plan.host_dir / "workspace"
    [job] = server.objects("Job", NS)
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert volumes["workspace"]["hostPath"]["path"] == str(workspace)
    assert volumes["session"]["hostPath"]["path"] == str(plan.session_dir)
    assert handle.sandbox_id == job["metadata"]["name"]
    paths = [workspace, *(workspace / d for d in ("in", "out", "session")), plan.session_dir]
    for path in [*paths, workspace / "left.txt"]:
        st = path.stat()
        if as_root:
            assert (st.st_uid, st.st_gid) == (65_534, 65_534), path
        else:
            mode = stat.S_IMODE(st.st_mode)
            assert mode & 0o022 == 0, (path, oct(mode))  # nobody else writes
            owner = 0o700 if path.is_dir() else 0o600
            assert mode & owner == owner, (path, oct(mode))
    assert all(path.is_dir() for path in paths)
    security = job["spec"]["template"]["spec"]["securityContext"]
    ids = (security["runAsUser"], security["runAsGroup"])
    assert ids == ((65_534, 65_534) if as_root else (1000, os.getegid()))


# -- cancel and cleanup -----------------------------------------------------------------------


async def test_cancel_deletes_the_job_and_everything_it_owns(server, backend, platform_ns):
    handle = await backend.launch(plan_in(platform_ns))
    task = await watching(server, backend, handle)
    await backend.cancel(handle)
    assert await asyncio.wait_for(task, 5) == Exit(
        None, "cancelled", "the Job was deleted by cancel", gone=True
    )
    for kind in (*KINDS, "Pod"):
        assert server.objects(kind, NS) == [], kind
    await backend.cancel(handle)  # gone already: fine
    deletes = [r for r in server.requests if r.method == "DELETE"]
    assert all(r.query.get("propagationPolicy") == "Background" for r in deletes)


async def test_a_cancel_returns_once_the_pod_is_gone(server, backend, platform_ns):
    """Deleting a Job only begins its pod's termination (30 s by Kubernetes' default): the
    cancel returned at once, and the engine started the replacement beside a runner still
    writing the session's files, its network policy gone with the Job. The pod's grace is
    the backend's own now, and the cancel waits it out (the fake's pods take 1 s to go)."""
    handle = await backend.launch(plan_in(platform_ns))
    [pod] = server.objects("Pod", NS)
    assert pod["spec"]["terminationGracePeriodSeconds"] == backend.settings.stop_grace_seconds
    server.pod_grace = 1.0
    task = await watching(server, backend, handle)
    await asyncio.wait_for(backend.cancel(handle), backend.settings.stop_grace_seconds + 15)
    assert server.objects("Pod", NS) == []
    # The watch too ends the activation only once the pod is gone: the Job goes at once, and
    # its end let the engine start the replacement beside the runner still stopping.
    server.pod_grace = 1.0
    other = await backend.launch(plan_in(platform_ns))
    watched = await watching(server, backend, other)
    await backend._delete_job(other.sandbox_id)  # the Job gone, its pod stopping
    assert server.objects("Job", NS) == []
    assert server.objects("Pod", NS) != []
    ended = await asyncio.wait_for(watched, 15)
    assert ended.reason == "lost"
    assert server.objects("Pod", NS) == []  # gone before the end was told
    assert (await asyncio.wait_for(task, 5)).reason == "cancelled"


@pytest.mark.parametrize(
    ("policy", "succeeded", "removed"),
    [
        ("always", True, True),
        ("always", False, True),
        ("on_success", True, True),
        ("on_success", False, False),
        ("never", True, False),
    ],
)
async def test_cleanup_follows_the_policy(server, platform_ns, policy, succeeded, removed):
    backend = KubernetesBackend(settings_for(server, cleanup=policy), platform_ns)
    handle = await backend.launch(plan_in(platform_ns))
    server.finish_job(handle.sandbox_id, 0 if succeeded else 1)
    await backend.cleanup(handle, succeeded=succeeded)
    await backend.close()
    left = {kind: len(server.objects(kind, NS)) for kind in KINDS}
    # A kept Job keeps all but its Secret: the ended attempt's token and provider keys.
    kept = {**dict.fromkeys(KINDS, 1), "Secret": 0}
    assert left == (dict.fromkeys(KINDS, 0) if removed else kept)


async def test_fake_api_a_stopped_job_kept_by_the_policy_keeps_no_secret(server, platform_ns):
    """Against the fake API server: a Job stopped because its pod could not start is suspended;
    kept by the policy, its Secret goes, and it is resumed with its deadline now — left
    suspended it never finished, and its TTL never removed it."""
    backend = KubernetesBackend(settings_for(server, cleanup="never"), platform_ns)
    handle = await backend.launch(plan_in(platform_ns))
    task = await watching(server, backend, handle)
    server.stall_pod(handle.sandbox_id, "InvalidImageName", "no such image")
    result = await asyncio.wait_for(task, 5)
    assert result.reason == "lost"
    await backend.cleanup(handle, succeeded=False)
    await backend.cleanup(handle, succeeded=False)  # again (a restarted leader): fine
    await backend.close()
    assert server.objects("Secret", NS) == []
    [job] = server.objects("Job", NS)  # kept, saying why, and finishing
    assert job["metadata"]["annotations"]["suzumio.io/stopped"] == result.detail
    assert not job["spec"].get("suspend")
    assert job["spec"]["activeDeadlineSeconds"] == 1  # the Job controller fails it at once


async def test_fake_api_a_kept_job_whose_launch_was_cut_short_is_made_to_finish(
    server, platform_ns
):
    """Against the fake API server: a Job left suspended by a launch cut short (the
    orchestrator stopped between its create and its resume), kept by the policy, stayed for
    ever; it now finishes at its deadline, saying why, with no Secret to start on."""
    backend = KubernetesBackend(settings_for(server, cleanup="never"), platform_ns)
    handle = await backend.launch(plan_in(platform_ns))
    # As the launch left it: suspended, no word of why (the fake drops its pod as a Job
    # controller does).
    jobs = client.BatchV1Api(await backend._client())
    await jobs.patch_namespaced_job(handle.sandbox_id, NS, {"spec": {"suspend": True}})
    await backend.cleanup(handle, succeeded=False)
    await backend.close()
    [job] = server.objects("Job", NS)
    assert "never started" in job["metadata"]["annotations"]["suzumio.io/stopped"]
    assert not job["spec"].get("suspend")
    assert job["spec"]["activeDeadlineSeconds"] == 1
    assert server.objects("Secret", NS) == []


async def test_fake_api_a_kept_job_still_running_is_stopped_a_finished_one_left_be(
    server, platform_ns
):
    """Against the fake API server (no Job controller: the stop is read off the Job): an
    attempt that ended while its Job still runs (lost: the API unreachable) and is kept by the
    policy is stopped, saying why — not left to run beside its retry to its deadline. A
    finished one is kept as it ended."""
    backend = KubernetesBackend(settings_for(server, cleanup="never"), platform_ns)
    running = await backend.launch(plan_in(platform_ns))
    finished = await backend.launch(plan_in(platform_ns))
    server.finish_job(finished.sandbox_id, 1)
    assert len(server.objects("Pod", NS)) == 2
    for handle in (running, finished, running):  # the first again: a restarted leader's
        await backend.cleanup(handle, succeeded=False)
    await backend.close()
    jobs = {j["metadata"]["name"]: j for j in server.objects("Job", NS)}
    stopped = jobs[running.sandbox_id]
    # Its deadline now: the Job controller fails it, its pod goes, and its TTL removes it
    # (suspended, it would never finish, nor go).
    assert stopped["spec"]["activeDeadlineSeconds"] == 1
    assert not stopped["spec"].get("suspend")
    assert "its attempt had ended" in stopped["metadata"]["annotations"]["suzumio.io/stopped"]
    assert not jobs[finished.sandbox_id]["spec"].get("suspend")
    assert "suzumio.io/stopped" not in (
        jobs[finished.sandbox_id]["metadata"].get("annotations") or {}
    )
    assert server.objects("Secret", NS) == []


# -- reconciliation, health -------------------------------------------------------------------


async def test_a_fresh_backend_finds_and_follows_live_jobs(server, backend, platform_ns):
    plans = [plan_in(platform_ns) for _ in range(2)]
    handles = [await backend.launch(plan) for plan in plans]
    stranger = KubernetesBackend(settings_for(server), "another-platform")
    await stranger.launch(make_plan(namespace="another-platform"))
    await stranger.close()

    restarted = KubernetesBackend(settings_for(server), platform_ns)
    try:
        found = await restarted.list_live()
        assert sorted(h.sandbox_id for h in found) == sorted(h.sandbox_id for h in handles)
        assert {h.activation_id for h in found} == {p.activation_id for p in plans}
        assert all(h.data["attempt"] == 1 and h.backend == "kubernetes" for h in found)
        assert not any(h.finished for h in found)
        server.finish_job(found[0].sandbox_id, 0)
        assert (await asyncio.wait_for(restarted.watch(found[0]), 5)).code == 0
        finished = {h.sandbox_id: h.finished for h in await restarted.list_live()}
        assert finished == {found[0].sandbox_id: True, found[1].sandbox_id: False}
    finally:
        await restarted.close()


async def test_the_empty_platform_namespace_is_listed_too(server):
    backend = KubernetesBackend(settings_for(server), "")
    try:
        handle = await backend.launch(make_plan())
        assert [h.sandbox_id for h in await backend.list_live()] == [handle.sandbox_id]
    finally:
        await backend.close()


async def test_fake_api_another_installations_jobs_in_the_namespace_are_none_of_its_own(
    server, platform_ns
):
    """Against the fake API server: two installations with the same platform namespace share
    the cluster's namespace; each one's reconciliation took the other's Jobs for orphans and
    deleted them. An unlabelled Job is from a release before installations were told apart."""
    made = []
    for installation in ("inst-a", "inst-b", None):
        backend = KubernetesBackend(settings_for(server), platform_ns, installation)
        made.append(backend)
        await backend.launch(plan_in(platform_ns))
    mine, theirs, older = made
    try:
        found = {h.sandbox_id for h in await mine.list_live()}
        everyone = {h.sandbox_id for h in await older.list_live()}
        assert len(everyone) == 3
        assert len(found) == 2
        [foreign] = everyone - found
        [job] = [j for j in server.objects("Job") if j["metadata"]["name"] == foreign]
        assert job["metadata"]["labels"]["suzumio.io/installation"] == "inst-b"
    finally:
        for backend in made:
            await backend.close()


async def test_health(server, backend, platform_ns):
    health = await backend.health()
    assert health.ok
    assert health.detail["version"] == server.git_version
    missing = KubernetesBackend(settings_for(server, namespace="nowhere"), platform_ns)
    assert not (await missing.health()).ok
    await missing.close()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    unreachable = KubernetesBackend(
        KubernetesSettings(namespace=NS, api_url=f"http://127.0.0.1:{closed_port}"), platform_ns
    )
    down = await unreachable.health()
    await unreachable.close()
    assert not down.ok
    assert down.detail["error"]


# -- dry run ----------------------------------------------------------------------------------


async def test_dry_run_validates_with_the_api_and_never_shows_a_secret(
    server, backend, platform_ns, caplog, capsys
):
    caplog.set_level(logging.DEBUG)
    plan = plan_in(platform_ns, network=NetworkProfile.NONE)
    manifests = await backend.dry_run(plan)
    assert [m["kind"] for m in manifests] == list(KINDS)
    secret = manifests[1]
    assert secret["stringData"]["SUZUMIO_MODEL_API_KEY"] == "***"
    assert json.loads(secret["stringData"]["input.json"])["token"] == "***"
    posts = [r for r in server.requests if r.method == "POST"]
    assert len(posts) == 4
    assert all(r.query.get("dryRun") == "All" for r in posts)
    assert all(server.objects(kind) == [] for kind in KINDS)
    job_uid = manifests[1]["metadata"]["ownerReferences"][0]["uid"]
    assert job_uid != "00000000-0000-0000-0000-000000000000"  # the dry-run Job's uid
    # The key appears nowhere: not in the output, not in a log line, not on the console.
    encoded = base64.b64encode(PROVIDER_KEY.encode()).decode()
    out = capsys.readouterr()
    for text in (json.dumps(manifests), caplog.text, out.out, out.err):
        for secret_text in (PROVIDER_KEY, encoded, TOKEN):
            assert secret_text not in text


async def test_launch_logs_no_secret(server, backend, platform_ns, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    handle = await backend.launch(plan_in(platform_ns))
    server.finish_job(handle.sandbox_id, 0)
    await backend.watch(handle)
    encoded = base64.b64encode(PROVIDER_KEY.encode()).decode()
    out = capsys.readouterr()
    for text in (caplog.text, out.out, out.err):
        assert PROVIDER_KEY not in text
        assert encoded not in text


async def test_dry_run_without_a_reachable_api_renders_only(platform_ns):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    settings = KubernetesSettings(image="i", api_url=f"http://127.0.0.1:{closed_port}")
    backend = KubernetesBackend(settings, platform_ns)
    try:
        manifests = await backend.dry_run(plan_in(platform_ns))
    finally:
        await backend.close()
    assert [m["kind"] for m in manifests] == list(KINDS)
    assert PROVIDER_KEY not in json.dumps(manifests)


async def test_dry_run_reports_what_the_api_rejects(server, backend, platform_ns):
    await backend.launch(plan := plan_in(platform_ns))
    with pytest.raises(LaunchError, match="already exists"):
        await backend.dry_run(plan)


# -- the fake itself: where it behaves like the API server in ways the backend relies on ------


async def test_the_fake_orphans_a_jobs_dependents_unless_told_otherwise(
    server, backend, platform_ns
):
    handle = await backend.launch(plan_in(platform_ns))
    api = client.ApiClient(client.Configuration(host=server.url))
    try:
        await client.BatchV1Api(api).delete_namespaced_job(handle.sandbox_id, NS)
        with pytest.raises(client.ApiException) as missing:
            await client.BatchV1Api(api).read_namespaced_job(handle.sandbox_id, NS)
        assert missing.value.status == 404
        assert json.loads(missing.value.body or "{}")["reason"] == "NotFound"
    finally:
        await api.close()
    [secret] = server.objects("Secret", NS)  # orphaned: what a Job deleted without a policy does
    assert "ownerReferences" not in secret["metadata"]
    assert len(server.objects("Pod", NS)) == 1


async def test_fake_api_watches_leave_the_requests_their_connections(server, platform_ns):
    """FAKE Kubernetes API server. Each watched Job holds two long polls (its Job, its pods):
    on the requests' own client they filled its pool (100 connections: ~50 Jobs), and
    launches and cancels queued behind them until they timed out. Here the requests' pool
    holds two connections and three Jobs are watched (six long polls): a launch and a cancel
    still go through at once."""
    settings = settings_for(server, api_connections=2, request_timeout_seconds=3)
    backend = KubernetesBackend(settings, platform_ns)
    try:
        handles = [await backend.launch(plan_in(platform_ns)) for _ in range(3)]
        tasks = [await watching(server, backend, handle) for handle in handles]
        fourth = await asyncio.wait_for(backend.launch(plan_in(platform_ns)), 10)
        assert fourth.sandbox_id not in {h.sandbox_id for h in handles}
        await asyncio.wait_for(backend.cancel(handles[0]), 10)
        for handle in handles[1:]:
            server.finish_job(handle.sandbox_id, 0)
        exits = await asyncio.wait_for(asyncio.gather(*tasks), 15)
        assert [e.code for e in exits[1:]] == [0, 0]
    finally:
        await backend.close()


class LosingJobAnswers(FakeKubernetesServer):
    """Stores the first Job it is sent, then answers 504 (as a proxy whose upstream took too
    long): the Job is there, its creator does not know."""

    lost = 0

    async def _route(self, request: Any, query: dict[str, str]) -> Any:
        answer = await super()._route(request, query)
        if request.method == "POST" and request.url.path.endswith("/jobs") and not self.lost:
            self.lost += 1
            raise ApiError(504, "Timeout", "the upstream took too long")
        return answer


async def test_fake_api_a_job_whose_creation_answer_is_lost_is_not_left_suspended(
    platform_ns: str,
) -> None:
    """Against a fake API server. The launch fails (retryable: the next attempt has another
    Job) and deletes what it may have created: left, the Job stayed suspended for good — no
    run, no TTL (it counts from a finish) — and its Secret of input and keys with it."""
    async with LosingJobAnswers(namespaces=[NS, "default"]) as server:
        backend = KubernetesBackend(settings_for(server), platform_ns)
        try:
            with pytest.raises(LaunchError) as failed:
                await backend.launch(plan_in(platform_ns))
            assert failed.value.retryable
            assert server.lost == 1
            assert server.objects("Job", NS) == []
            assert server.objects("Secret", NS) == []
        finally:
            await backend.close()


class RefusingSecretDeletes(FakeKubernetesServer):
    """Answers 503 to a Secret's deletion (an API server in trouble)."""

    async def _route(self, request: Any, query: dict[str, str]) -> Any:
        if request.method == "DELETE" and "/secrets/" in request.url.path:
            raise ApiError(503, "ServiceUnavailable", "the API server is in trouble")
        return await super()._route(request, query)


async def test_fake_api_a_kept_jobs_secret_not_deleted_fails_the_cleanup(platform_ns: str) -> None:
    """Against a fake API server. Swallowed, the failure left the Secret (the token and the
    provider keys) for good: nothing looks at an ended Job again. Raised, the orchestrator
    stops the attempt's sandbox until it can — deleting the Job deletes its Secret."""
    async with RefusingSecretDeletes(namespaces=[NS, "default"]) as server:
        backend = KubernetesBackend(settings_for(server, cleanup="never"), platform_ns)
        try:
            handle = await backend.launch(plan_in(platform_ns))
            server.finish_job(handle.sandbox_id, 1)
            with pytest.raises(client.ApiException) as refused:
                await backend.cleanup(handle, succeeded=False)
            assert refused.value.status == 503
            await backend.cancel(handle)  # what the orchestrator then does
            assert server.objects("Secret", NS) == []
        finally:
            await backend.close()
