"""The kubernetes backend (DESIGN.md §8): one Job per activation, through kubernetes-asyncio.

Launch creates the Job suspended, then its Secret, ConfigMap and NetworkPolicy owned by the
Job's uid, then resumes the Job: the pod never starts before its input or its network policy
exists, and deleting the Job (cancel, cleanup, `ttlSecondsAfterFinished`) removes everything.
Every step tolerates 409 AlreadyExists, so a retried launch of the same attempt is idempotent;
a launch that fails halfway deletes its Job (and so the rest).

Watch follows the Job and its pods through the watch API (re-reading them with backoff when a
watch fails) until the Job is complete or failed, then reads the pod's terminated container for
the exit code. A pod that will never start (`kubernetes_pods`: a bad image, a config error, no
node for it) does not fail a Job with `backoffLimit: 0` before its deadline: the watch gives it
up, stops the Job (`suspend`, which deletes the pod; the Job keeps why in an annotation, for a
watch after a restart and for whoever looks at a Job the cleanup policy keeps) and ends the
activation with the pod's reason; so does a Job that gets no pod at all (the Job controller
cannot create it: a quota, an admission policy — no condition says so). A Job found suspended
without that annotation is a launch cut short before the resume (the orchestrator stopped in
between): it would never run, so it ends at once, nothing having run. Either kind, kept by
the cleanup policy, is resumed with its deadline now so that it finishes and its TTL takes it
(its Secret gone, its pod cannot start). With `host_paths`,
launch first creates the activation's directories on the node and hands them to the sandbox's
user (hostPath ignores `fsGroup`).
Manifests are in `kubernetes_render`; this module does the talking.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any, cast

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException
from kubernetes_asyncio.watch import Watch

from suzumio.orchestrator.backends.base import (
    Exit,
    Handle,
    Health,
    LaunchError,
    LaunchPlan,
    of_another_installation,
)
from suzumio.orchestrator.backends.docker_settings import give_tree, private_mode
from suzumio.orchestrator.backends.kubernetes_pods import StartCheck, Stuck
from suzumio.orchestrator.backends.kubernetes_render import (
    ACTIVATION_ANNOTATION,
    CONTAINER,
    INSTALLATION_ANNOTATION,
    JOB_LABEL,
    KubernetesSettings,
    Manifest,
    egress_warning,
    redact,
    render,
    runner_owner,
    selector_for,
    with_owner_uid,
)
from suzumio.platform.logging import get_logger

__all__ = ["KubernetesBackend", "KubernetesSettings", "job_outcome"]

log = get_logger(__name__)

_UNREACHABLE = (aiohttp.ClientError, OSError, TimeoutError)
# The Job's pods, by the label of our own its pod template carries: the Job controller's
# `batch.kubernetes.io/job-name` exists only since Kubernetes 1.27 (before, `job-name`), and
# without its pod the watch would see neither a pod that cannot start nor the exit code.
_JOB_POD_LABEL = JOB_LABEL
STOPPED_ANNOTATION = "suzumio.io/stopped"
"""On a Job the watch stopped because its pod could not start: the activation's detail."""
FINAL_ANNOTATION = "suzumio.io/stopped-final"  # "true": another attempt would fail the same way
INTERRUPTED = "its launch did not finish: the Job was created but never started"
KEPT_STOPPED = "stopped by the cleanup: its attempt had ended while it still ran"
POD_GONE_MARGIN_SECONDS = 10.0  # past its pod's grace, for the kubelet to report it gone
POD_GONE_POLL_SECONDS = 0.5
# The Job of a launch cut short whose deletion failed: asked again from this, doubling to a
# minute, for half an hour (the leader's sweep after a takeover is the last resort).
CUT_SHORT_FIRST_RETRY_SECONDS = 1.0
CUT_SHORT_RETRY_FOR_SECONDS = 1_800.0


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        try:
            message = json.loads(exc.body or "{}").get("message") or exc.reason
        except (ValueError, AttributeError):
            message = exc.reason
        return f"{exc.status} {message}"
    return f"{type(exc).__name__}: {exc}"


def _body(manifest: Manifest) -> Any:
    """A manifest as a request body: the client sends plain dicts as they are."""
    return manifest


def _retryable(exc: BaseException) -> bool:
    return not isinstance(exc, ApiException) or exc.status in (409, 429) or exc.status >= 500


def job_outcome(job: Manifest) -> tuple[str, str, str] | None:
    """(`Complete` | `Failed` | `Stopped`, reason, message) once the Job is finished (or
    stopped by a watch, its pod never started, or left suspended by a launch cut short),
    else None."""
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    stopped = annotations.get(STOPPED_ANNOTATION)
    if stopped is not None:
        return "Stopped", "final" if annotations.get(FINAL_ANNOTATION) == "true" else "", stopped
    if (job.get("spec") or {}).get("suspend"):
        # Launch resumes the Job before it returns a handle, and a watch's own stop leaves
        # the annotation above: a suspended Job without it is a launch cut short (the
        # orchestrator stopped between the two). It would never run — its deadline does not
        # count while suspended, its TTL never starts — so it ends now; nothing ran.
        return "Stopped", "", INTERRUPTED
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") != "True":
            continue
        kind = {"Complete": "Complete", "SuccessCriteriaMet": "Complete"}.get(
            condition.get("type", ""),
            "Failed" if condition.get("type") in ("Failed", "FailureTarget") else "",
        )
        if kind:
            return kind, condition.get("reason") or "", condition.get("message") or ""
    return None


def exit_from(outcome: tuple[str, str, str], pod: Manifest | None) -> Exit:
    """The Exit of a finished Job, from its outcome and its pod (None when it is gone)."""
    kind, reason, message = outcome
    if kind == "Stopped":  # its pod never started: nothing ran, no exit code
        return Exit(None, "lost", message, retryable=reason != "final")
    if kind == "Failed" and reason == "DeadlineExceeded":
        return Exit(None, "timeout", message or "the Job's active deadline passed")
    return _pod_exit(kind, reason, pod)


def _pod_exit(kind: str, reason: str, pod: Manifest | None) -> Exit:
    status = (pod or {}).get("status") or {}
    if status.get("reason") == "Evicted":
        return Exit(None, "killed", status.get("message") or "the pod was evicted")
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if container.get("name") == CONTAINER and terminated:
            code = terminated.get("exitCode")
            if terminated.get("reason") == "OOMKilled":
                return Exit(code, "oom", "the container ran out of memory")
            if isinstance(code, int) and code >= 128:
                # Killed by a signal (128 + its number: a node's shutdown, a kill), as the
                # docker backend reads it: no exit code of the runner's own. A runner killed
                # after it recorded its output then ends as its output says, not as a failed
                # exit whose work is done again.
                detail = f"killed by signal {code - 128}"
                return Exit(None, "killed", f"{terminated.get('reason') or ''} {detail}".strip())
            return Exit(code, "exited", terminated.get("reason") or "")
    if kind == "Complete":
        return Exit(0, "exited", "the Job completed (its pod is gone)")
    return Exit(None, "lost", f"the Job failed ({reason or 'no reason'}) and left no exit code")


def _hand_over(root: Path, uid: int, gid: int) -> None:
    """Make `root` and everything in it the sandbox user's, writable by it and by nobody
    else: chowned when we may (root), else the sandbox runs as our own user
    (`runner_owner`). As the docker backend does: a hostPath volume keeps the node's owners,
    `fsGroup` does not apply to it. Never through a link: another pod of the session may be
    swapping entries for links as we walk."""
    as_root = os.geteuid() == 0
    give_tree(root, (uid, gid) if as_root else None, private_mode)


def prepare_host_dirs(plan: LaunchPlan, settings: KubernetesSettings) -> None:
    """The workspace (with `in`, `out` and the session's mount point) and the session's
    directory on the node, writable by the runner's user (`host_paths` only): made by the
    kubelet they would be root's, 0755, and the runner could write none of them."""
    workspace = plan.host_dir / "workspace"
    for directory in (*(workspace / d for d in ("in", "out", "session")), plan.session_dir):
        directory.mkdir(parents=True, exist_ok=True)
    uid, gid = runner_owner(settings)
    for root in (workspace, plan.session_dir):
        _hand_over(root, uid, gid)


class KubernetesBackend:
    """Runs activations as Kubernetes Jobs in `settings.namespace`; `namespace` is the
    platform's (the label every Job carries, so two platforms can share a cluster)."""

    name = "kubernetes"
    refused_give_up_seconds = 300.0
    """How long a watch the API server keeps refusing (401/403) is retried before it ends."""

    def __init__(
        self, settings: KubernetesSettings, namespace: str = "", installation: str | None = None
    ) -> None:
        self.settings = settings
        self.namespace = namespace
        self.installation = installation
        self._api: ApiClient | None = None
        self._watch_api: ApiClient | None = None
        self._connecting = asyncio.Lock()
        self._cancelled: set[str] = set()
        self._deleting: dict[str, asyncio.Task[None]] = {}  # Jobs of launches cut short
        # Watches the API server currently refuses (401/403), by Job: why, for `health`.
        self._refused: dict[str, str] = {}

    @property
    def _ns(self) -> str:
        return self.settings.namespace

    @property
    def _timeout(self) -> float:
        return self.settings.request_timeout_seconds

    async def _client(self) -> ApiClient:
        async with self._connecting:
            if self._api is None:
                self._api = await self._new_client(self.settings.api_connections)
            return self._api

    async def _watcher(self) -> ApiClient:
        """The client of the watches (a pool of their own): two long polls per watched Job,
        each holding its connection for up to a minute. On the requests' client they filled
        its pool at ~50 Jobs, and launches, cancels and listings queued behind them until
        they timed out."""
        async with self._connecting:
            if self._watch_api is None:
                self._watch_api = await self._new_client(self.settings.watch_connections)
            return self._watch_api

    async def _new_client(self, connections: int) -> ApiClient:
        configuration = await self._configuration()
        configuration.connection_pool_maxsize = connections
        return ApiClient(configuration=configuration)

    async def _configuration(self) -> Configuration:
        settings = self.settings
        if settings.api_url:
            return Configuration(host=settings.api_url.rstrip("/"))
        configuration = Configuration()
        if settings.in_cluster:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            await config.load_kube_config(
                config_file=str(settings.kubeconfig) if settings.kubeconfig else None,
                context=settings.context,
                client_configuration=configuration,
            )
        return configuration

    # -- launch ------------------------------------------------------------------------------

    async def launch(self, plan: LaunchPlan) -> Handle:
        try:
            job, *dependents = render(
                plan, self.settings, namespace=self.namespace, installation=self.installation
            )
        except ValueError as exc:
            raise LaunchError(str(exc), retryable=False) from exc
        name = job["metadata"]["name"]
        if self.settings.host_paths:
            try:
                await asyncio.to_thread(prepare_host_dirs, plan, self.settings)
            except OSError as exc:
                raise LaunchError(f"job {name}: host directories: {exc}") from exc
        try:
            api = await self._client()
            uid = await self._create_job(api, job, plan.activation_id)
        except (ApiException, ConfigException, *_UNREACHABLE) as exc:
            if isinstance(exc, _UNREACHABLE) or (
                isinstance(exc, ApiException) and exc.status >= 500
            ):
                # Only the answer may have been lost: a Job created, suspended, that nothing
                # would run or expire (its TTL counts from a finish it never has), with the
                # Secret of its input and keys. The next attempt has another name.
                await self._delete_cut_short(name)
            raise LaunchError(f"job {name}: {_describe(exc)}", retryable=_retryable(exc)) from exc
        try:
            for manifest in dependents:
                await self._create(api, with_owner_uid(manifest, uid))
            resume = _body({"spec": {"suspend": False}})
            await client.BatchV1Api(api).patch_namespaced_job(
                name, self._ns, resume, _request_timeout=self._timeout
            )
        except (ApiException, *_UNREACHABLE) as exc:
            await self._delete_cut_short(name)
            raise LaunchError(f"job {name}: {_describe(exc)}", retryable=_retryable(exc)) from exc
        log.info("kubernetes job launched", job=name, activation=plan.activation_id)
        data = {"namespace": self._ns, "uid": uid, "attempt": plan.attempt}
        return Handle(plan.activation_id, self.name, name, data)

    async def _delete_cut_short(self, name: str) -> None:
        """Delete the Job of a launch cut short — suspended, it would never run, finish or
        expire, and its Secret holds the token and the provider keys. An API server that
        does not take the deletion now is asked again in the background (backing off, for a
        while): before, the Job stayed until a new leader's sweep, weeks away perhaps."""
        try:
            await self._delete_job(name)
        except (ApiException, *_UNREACHABLE) as exc:
            log.warning("kubernetes job not deleted yet", job=name, error=_describe(exc))
            if name not in self._deleting:
                task = asyncio.create_task(self._delete_until_gone(name))
                self._deleting[name] = task
                task.add_done_callback(lambda _: self._deleting.pop(name, None))

    async def _delete_until_gone(self, name: str) -> None:
        delay = CUT_SHORT_FIRST_RETRY_SECONDS
        deadline = time.monotonic() + CUT_SHORT_RETRY_FOR_SECONDS
        while time.monotonic() < deadline:
            await asyncio.sleep(delay)
            try:
                await self._delete_job(name)
            except (ApiException, *_UNREACHABLE) as exc:
                log.warning("kubernetes job not deleted yet", job=name, error=_describe(exc))
                delay = min(delay * 2, 60.0)
            else:
                return
        log.error("kubernetes job of a launch cut short left", job=name)

    async def _create_job(self, api: ApiClient, job: Manifest, activation_id: str) -> str:
        batch = client.BatchV1Api(api)
        name = job["metadata"]["name"]
        try:
            created = await batch.create_namespaced_job(
                self._ns, _body(job), _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
            created = await batch.read_namespaced_job(
                name, self._ns, _request_timeout=self._timeout
            )
            owner = (created.metadata.annotations or {}).get(ACTIVATION_ANNOTATION)
            if owner != activation_id:
                raise LaunchError(f"job {name} belongs to {owner}", retryable=False) from exc
        return str(created.metadata.uid)

    async def _create(self, api: ApiClient, manifest: Manifest, dry_run: str | None = None) -> Any:
        """Create one object (409 AlreadyExists is success); returns the server's object."""
        kind, body = manifest["kind"], _body(manifest)
        options: dict[str, Any] = {"_request_timeout": self._timeout}
        if dry_run:
            options["dry_run"] = dry_run
        try:
            if kind == "Secret":
                return await self._create_secret(api, body, options)
            if kind == "Job":
                return await client.BatchV1Api(api).create_namespaced_job(self._ns, body, **options)
            if kind == "ConfigMap":
                core = client.CoreV1Api(api)
                return await core.create_namespaced_config_map(self._ns, body, **options)
            networking = client.NetworkingV1Api(api)
            return await networking.create_namespaced_network_policy(self._ns, body, **options)
        except ApiException as exc:
            if exc.status != 409 or dry_run:
                raise
            return None

    async def _create_secret(self, api: ApiClient, body: Any, options: dict[str, Any]) -> None:
        # Unread and undeserialized: the answer echoes the keys, and the client would keep
        # it as `last_response` and log it at debug level.
        core = client.CoreV1Api(api)
        raw = await core.create_namespaced_secret(self._ns, body, _preload_content=False, **options)
        response = cast("aiohttp.ClientResponse", raw)
        try:
            if response.status >= 400:
                raise ApiException(status=response.status, reason=response.reason)
        finally:
            response.release()

    # -- watch -------------------------------------------------------------------------------

    async def watch(self, handle: Handle) -> Exit:
        name = handle.sandbox_id
        settings = self.settings
        start = StartCheck(settings.start_grace_seconds, settings.unschedulable_grace_seconds)
        delay = 0.2
        refused_since: float | None = None  # since when the Job or its pods are refused
        try:
            while True:
                try:
                    api = await self._client()
                    job = await self._read_job(api, name)
                    while job is not None and job_outcome(job) is None:
                        # The pods as they are now: this is also the poll when watches fail.
                        stuck = start.check_all(await self._pods(api, name))
                        # The Job and its pods are readable: polling sees its end, even if
                        # the watch verb is refused (that is reported, not given up on).
                        refused_since = None
                        if stuck is None:
                            version = job["metadata"].get("resourceVersion")
                            change = await self._next_change(api, name, version, start)
                            self._refused.pop(name, None)  # a whole round went through
                            if not isinstance(change, Stuck):
                                job, delay = change, 0.2
                                continue
                            stuck = change
                        return await self._give_up(name, stuck)
                    outcome = job_outcome(job) if job else None
                    if outcome is None:  # the Job is gone
                        # Its pod may still be stopping (the Job goes at once, its pod takes
                        # its grace): the activation ends, and its replacement starts, once
                        # the runner is gone too.
                        await self._pods_gone(name)
                        return self._gone(name)
                    return exit_from(outcome, await self._pod_of(api, name))
                except ApiException as exc:
                    if exc.status not in (401, 403):
                        log.warning(
                            "kubernetes watch failed; polling", job=name, error=_describe(exc)
                        )
                    else:
                        now = asyncio.get_running_loop().time()
                        refused_since = now if refused_since is None else refused_since
                        refused = self._refuse(name, exc, now - refused_since)
                        if refused is not None:
                            return refused
                except Exception as exc:  # the watch API can fail in many ways: poll instead
                    log.warning("kubernetes watch failed; polling", job=name, error=_describe(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
        finally:
            self._refused.pop(name, None)

    def _refuse(self, name: str, exc: ApiException, refused_for: float) -> Exit | None:
        """A 401/403: the orchestrator's credentials or RBAC, not a blip. Reported at once (the
        log, `health`); still retried (a rotated token, a role being fixed) until it has
        lasted `refused_give_up_seconds`, then the watch ends with the API server's words —
        not retryable: we cannot see whether its pod still runs, so another attempt might run
        beside it."""
        detail = _describe(exc)
        self._refused[name] = detail
        if refused_for >= self.refused_give_up_seconds:
            log.error("kubernetes watch refused; given up", job=name, error=detail)
            message = (
                f"the Kubernetes API server refused to show the Job for "
                f"{refused_for:.0f} s (the orchestrator's credentials or RBAC): {detail}"
            )
            return Exit(None, "lost", message, retryable=False)
        log.error(
            "kubernetes watch refused; retrying",
            job=name,
            error=detail,
            refused_for=round(refused_for, 1),
            gives_up_after=self.refused_give_up_seconds,
        )
        return None

    async def _read_job(self, api: ApiClient, name: str) -> Manifest | None:
        try:
            job = await client.BatchV1Api(api).read_namespaced_job(
                name, self._ns, _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        serialized: Manifest = api.sanitize_for_serialization(job)
        return serialized

    async def _next_change(
        self, api: ApiClient, name: str, version: str | None, start: StartCheck
    ) -> Manifest | Stuck | None:
        """The Job after its next change (None once deleted), or its pod given up; the Job
        as it is now when neither happened within a watch request (or a grace ended)."""
        watcher = await self._watcher()
        jobs = asyncio.create_task(self._job_change(watcher, name, version))
        pods = asyncio.create_task(self._pod_stuck(watcher, name, start))
        try:
            done, _ = await asyncio.wait((jobs, pods), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (jobs, pods):
                task.cancel()
            await asyncio.gather(jobs, pods, return_exceptions=True)
        if jobs in done:
            changed, job = jobs.result()  # a failed watch raises: the caller polls
            if changed:
                return job
        if pods in done and (stuck := pods.result()) is not None:
            return stuck
        return await self._read_job(api, name)

    async def _job_change(
        self, api: ApiClient, name: str, version: str | None
    ) -> tuple[bool, Manifest | None]:
        """(True, the Job once finished or None once deleted); (False, None) when the watch
        request ended with neither (its server-side timeout)."""
        batch = client.BatchV1Api(api)
        async with Watch() as watch:
            stream = watch.stream(
                batch.list_namespaced_job,
                namespace=self._ns,
                field_selector=f"metadata.name={name}",
                resource_version=version,
                timeout_seconds=self.settings.watch_timeout_seconds,
                _request_timeout=self.settings.watch_timeout_seconds + self._timeout,
            )
            async for event in stream:
                if event["type"] == "DELETED":
                    return True, None
                obj: Manifest = event["raw_object"]
                if job_outcome(obj) is not None:
                    return True, obj
        return False, None

    async def _pod_stuck(self, api: ApiClient, name: str, start: StartCheck) -> Stuck | None:
        """The Job's pod given up, as the pod watch shows it; None when the watch request ended
        first (it ends when the nearest grace does, so that one is looked at again)."""
        timeout = self.settings.watch_timeout_seconds
        graces = (start.next_deadline_in(), start.no_pod_deadline_in())
        grace = min((g for g in graces if g is not None), default=None)
        if grace is not None:
            timeout = max(1, min(timeout, int(grace) + 1))
        async with Watch() as watch:
            stream = watch.stream(
                client.CoreV1Api(api).list_namespaced_pod,
                namespace=self._ns,
                label_selector=f"{_JOB_POD_LABEL}={name}",
                timeout_seconds=timeout,
                _request_timeout=timeout + self._timeout,
            )
            async for event in stream:
                pod: Manifest = event["raw_object"]
                if event["type"] == "DELETED":
                    start.forget(pod)
                elif (stuck := start.check(pod)) is not None:
                    return stuck
        return None

    async def _give_up(self, name: str, stuck: Stuck) -> Exit:
        """Stop the Job of a pod that will not start: suspended, the Job controller deletes the
        pod (no more pulls, no node's room held); the Job, kept or deleted by the cleanup
        policy, says why."""
        log.warning(
            "kubernetes pod did not start",
            job=name,
            reason=stuck.reason,
            detail=stuck.detail,
            retryable=stuck.retryable,
        )
        stop: Manifest = {
            "metadata": {
                "annotations": {
                    STOPPED_ANNOTATION: stuck.detail,
                    FINAL_ANNOTATION: "false" if stuck.retryable else "true",
                }
            },
            "spec": {"suspend": True},
        }
        try:
            api = await self._client()
            await client.BatchV1Api(api).patch_namespaced_job(
                name, self._ns, _body(stop), _request_timeout=self._timeout
            )
        except (ApiException, *_UNREACHABLE) as exc:  # the cleanup (or the deadline) ends it
            log.warning("kubernetes job not stopped", job=name, error=_describe(exc))
        return stuck.exit()

    async def _pods(self, api: ApiClient, name: str) -> list[Manifest]:
        pods = await client.CoreV1Api(api).list_namespaced_pod(
            self._ns, label_selector=f"{_JOB_POD_LABEL}={name}", _request_timeout=self._timeout
        )
        return [api.sanitize_for_serialization(p) for p in pods.items]

    async def _pod_of(self, api: ApiClient, name: str) -> Manifest | None:
        serialized = await self._pods(api, name)
        finished = [p for p in serialized if (p.get("status") or {}).get("containerStatuses")]
        candidates = finished or serialized
        return candidates[-1] if candidates else None

    def _gone(self, name: str) -> Exit:
        # Deleted, its pod with it: the exit code is gone too. A cancel that came just after
        # the runner recorded its output must not undo the work: the engine ends it by that.
        if name in self._cancelled:
            return Exit(None, "cancelled", "the Job was deleted by cancel", gone=True)
        return Exit(None, "lost", "the Job was deleted", gone=True)

    # -- cancel, cleanup, reconciliation, health -----------------------------------------------

    async def cancel(self, handle: Handle) -> None:
        """Delete the Job, and wait (its pod's grace, and a little more) until its pod is
        gone: deleting a Job only begins its pod's termination, and the engine starts a
        cancelled activation's replacement once this returns — beside a runner still writing
        the session's files, its network policy gone with the Job."""
        self._cancelled.add(handle.sandbox_id)
        await self._delete_job(handle.sandbox_id)
        await self._pods_gone(handle.sandbox_id)

    async def _pods_gone(self, name: str) -> None:
        deadline = time.monotonic() + self.settings.stop_grace_seconds + POD_GONE_MARGIN_SECONDS
        while True:
            try:
                left = await self._pods(await self._client(), name)
            except (ApiException, *_UNREACHABLE) as exc:
                log.warning("kubernetes pods not looked at", job=name, error=_describe(exc))
                return
            if not left:
                return
            if time.monotonic() >= deadline:
                log.warning("kubernetes pod outlived its cancel", job=name, pods=len(left))
                return
            await asyncio.sleep(POD_GONE_POLL_SECONDS)

    async def cleanup(self, handle: Handle, succeeded: bool) -> None:
        policy = self.settings.cleanup
        if policy == "always" or (policy == "on_success" and succeeded):
            await self._delete_job(handle.sandbox_id)
        else:
            # Kept for whoever looks into it: the Job, its pod and ConfigMap say what ran and
            # how it ended; the Secret (the input with its token, the provider keys) is of no
            # use to an ended attempt, and a Job stopped before its pod started is never
            # finished, so its TTL would never take it.
            await self._delete_secret(handle.sandbox_id)
            await self._stop_kept(handle.sandbox_id)
        self._cancelled.discard(handle.sandbox_id)

    async def _stop_kept(self, name: str) -> None:
        """A kept Job whose attempt ended while it still runs (the attempt was lost: the API
        unreachable, the watch gave up) is stopped rather than run on beside the attempt's
        retry, fenced, spending its node's room and the provider's bill to its deadline: its
        deadline is brought to now (`activeDeadlineSeconds` 1), so the Job controller fails
        it and its pod goes. Not suspended: a suspended Job never finishes, and its TTL
        would never remove it. It says why. Raises when the API server did not take it: the
        orchestrator then stops the sandbox until it can."""
        api = await self._client()
        jobs = client.BatchV1Api(api)
        try:
            job = await jobs.read_namespaced_job(name, self._ns, _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        manifest = api.sanitize_for_serialization(job)
        if (manifest.get("spec") or {}).get("suspend"):
            # Stopped before its pod started (by its watch, or a launch cut short): kept so,
            # it never finishes, and its TTL never removed it. Resumed with its deadline
            # now, it fails at once (its pod cannot start: the Secret went) and its TTL
            # takes it as it takes any kept Job; it still says why it stopped.
            annotations = (manifest.get("metadata") or {}).get("annotations") or {}
            why = annotations.get(STOPPED_ANNOTATION, INTERRUPTED)
            stop: Manifest = {
                "metadata": {"annotations": {STOPPED_ANNOTATION: why}},
                "spec": {"suspend": False, "activeDeadlineSeconds": 1},
            }
        elif job_outcome(manifest) is not None:
            return  # finished, or stopped already
        else:
            stop = {
                "metadata": {"annotations": {STOPPED_ANNOTATION: KEPT_STOPPED}},
                "spec": {"activeDeadlineSeconds": 1},
            }
        try:
            await jobs.patch_namespaced_job(
                name, self._ns, _body(stop), _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
        log.warning("kubernetes kept job stopped", job=name)

    async def _delete_secret(self, name: str) -> None:
        """Raises when the API server did not take the deletion: the cleanup then fails, and
        the orchestrator stops the attempt's sandbox until it can (deleting the Job, and the
        Secret with it) — nothing else would look at an ended Job's Secret again."""
        api = await self._client()
        try:
            await client.CoreV1Api(api).delete_namespaced_secret(
                name, self._ns, _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status != 404:
                log.warning("kubernetes secret not deleted", job=name, error=_describe(exc))
                raise
        except _UNREACHABLE as exc:
            log.warning("kubernetes secret not deleted", job=name, error=_describe(exc))
            raise

    async def _delete_job(self, name: str) -> None:
        # Background: the garbage collector removes the pod, Secret, ConfigMap and policy
        # (a Job deleted without a policy orphans them).
        api = await self._client()
        try:
            await client.BatchV1Api(api).delete_namespaced_job(
                name, self._ns, propagation_policy="Background", _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
        log.info("kubernetes job deleted", job=name)

    async def list_live(self) -> list[Handle]:
        api = await self._client()
        jobs = await client.BatchV1Api(api).list_namespaced_job(
            self._ns, label_selector=selector_for(self.namespace), _request_timeout=self._timeout
        )
        handles = []
        for job in jobs.items:
            annotations = job.metadata.annotations or {}
            activation = annotations.get(ACTIVATION_ANNOTATION)
            if activation is None:
                continue
            # Another installation sharing the Kubernetes namespace with the same platform
            # namespace: not an orphan of this one's, to be deleted at its takeover.
            if of_another_installation(annotations.get(INSTALLATION_ANNOTATION), self.installation):
                continue
            attempt = annotations.get("suzumio.io/attempt", "0")
            data = {"namespace": self._ns, "uid": job.metadata.uid, "attempt": int(attempt)}
            ended = job_outcome(api.sanitize_for_serialization(job)) is not None
            handles.append(Handle(activation, self.name, job.metadata.name, data, finished=ended))
        return handles

    async def release(self) -> None:
        # A cancel is sent again by whichever replica leads next (it is in the log); the
        # refusals were its watches', which ended.
        self._cancelled.clear()
        self._refused.clear()

    async def health(self) -> Health:
        detail: dict[str, Any] = {"namespace": self._ns}
        if (warning := egress_warning(self.settings)) is not None:
            detail["warning"] = warning
        try:
            api = await self._client()
            version = await client.VersionApi(api).get_code(_request_timeout=self._timeout)
            detail["version"] = version.git_version
            await client.CoreV1Api(api).read_namespace(self._ns, _request_timeout=self._timeout)
        except (ApiException, ConfigException, *_UNREACHABLE) as exc:
            detail["error"] = _describe(exc)
            return Health(ok=False, detail=detail)
        if self._refused:  # the namespace is readable, the Jobs or pods are not
            job, why = next(iter(self._refused.items()))
            detail["error"] = f"watch of {len(self._refused)} job(s) refused, e.g. {job}: {why}"
            return Health(ok=False, detail=detail)
        return Health(ok=True, detail=detail)

    async def close(self) -> None:
        for task in list(self._deleting.values()):
            task.cancel()
        if self._deleting:
            await asyncio.wait(list(self._deleting.values()))
        for api in (self._api, self._watch_api):
            if api is not None:
                await api.close()
        self._api = self._watch_api = None

    # -- dry run -----------------------------------------------------------------------------

    async def dry_run(self, plan: LaunchPlan) -> list[Manifest]:
        """The manifests of `plan`, Secret values redacted; also sent to the API server with
        `dryRun=All` when it is reachable (only the redacted Secret ever leaves the process).

        Raises:
            LaunchError: the plan cannot run here, or the API server rejected a manifest.
        """
        try:
            manifests = redact(
                render(
                    plan, self.settings, namespace=self.namespace, installation=self.installation
                )
            )
        except ValueError as exc:
            raise LaunchError(str(exc), retryable=False) from exc
        try:
            api = await self._client()
            job = await self._create(api, manifests[0], dry_run="All")
        except (ConfigException, *_UNREACHABLE) as exc:
            log.info("kubernetes api not reachable: rendered only", error=_describe(exc))
            return manifests
        except ApiException as exc:
            raise LaunchError(f"rejected: {_describe(exc)}", retryable=False) from exc
        uid = str(job.metadata.uid)
        checked = [manifests[0], *(with_owner_uid(m, uid) for m in manifests[1:])]
        for manifest in checked[1:]:
            try:
                await self._create(api, manifest, dry_run="All")
            except ApiException as exc:
                kind = manifest["kind"]
                raise LaunchError(f"{kind} rejected: {_describe(exc)}", retryable=False) from exc
        return checked
