"""A fake Kubernetes API server, for the tests of the kubernetes backend where no cluster exists
(DESIGN.md §13: a test that uses it says so).

Starlette behind an in-process uvicorn on 127.0.0.1 (an ephemeral port), no authentication:
point a client at `server.url`. It answers the part of the API the backend uses the way the
API server does: `/version`, namespaces (read), and create/read/list/patch/delete of ConfigMaps,
Secrets, Pods (core/v1), Jobs (batch/v1) and NetworkPolicies (networking.k8s.io/v1), with
`dryRun=All`, label and field selectors, `watch=true` streams (one JSON event per line, from a
`resourceVersion` or from now), uid/resourceVersion assignment, Secret `stringData` folded into
base64 `data`, owner-reference garbage collection (a deleted owner takes its dependents unless
`Orphan`, which is what a Job deleted without a propagation policy does; a dependent whose
owner does not exist is collected at once), and `Status` errors (404 NotFound, 409
AlreadyExists, 422 Invalid, 400 BadRequest).

There is no Job controller: a Job that is not suspended gets a running Pod, and the test ends it
with `finish_job`; a Job suspended while it runs loses its pods (as the controller does).
`stall_pod` leaves a Job's pod unable to start (a waiting container, or no node for it).
`objects(kind)` shows what is stored.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import re
import secrets
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Self

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from suzumio.testing.inprocess import InProcessServer

Obj = dict[str, Any]


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    default_propagation: str = "Background"

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]


KINDS = (
    Kind("v1", "ConfigMap", "configmaps"),
    Kind("v1", "Secret", "secrets"),
    Kind("v1", "Pod", "pods"),
    Kind("batch/v1", "Job", "jobs", default_propagation="Orphan"),  # as the real API does
    Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
)
_BY_PATH = {(k.api_version, k.plural): k for k in KINDS}
_BY_NAME = {**{k.kind: k for k in KINDS}, **{k.plural: k for k in KINDS}}
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DATA_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
_UID_LABELS = ("batch.kubernetes.io/controller-uid", "controller-uid")
_TRUE = ("1", "t", "T", "true", "TRUE", "True")  # what the API server's ParseBool accepts
_NO_RESOURCE = "the server could not find the requested resource"


class ApiError(Exception):
    """An error answered as a `Status` object."""

    def __init__(self, code: int, reason: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> Obj:
        body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
        body |= {"message": self.message, "reason": self.reason, "code": self.code}
        if self.details:
            body["details"] = self.details
        return body


@dataclass(frozen=True)
class RecordedCall:
    method: str
    path: str
    query: dict[str, str]


@dataclass(eq=False)
class _Watcher:
    kind: Kind
    namespace: str
    matches: Callable[[Obj], bool]
    queue: asyncio.Queue[tuple[str, Obj] | None] = field(default_factory=asyncio.Queue)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _invalid(kind: Kind, name: str, path: str, problem: str) -> ApiError:
    message = f'{kind.kind} "{name}" is invalid: {path}: {problem}'
    return ApiError(422, "Invalid", message, name=name, group=kind.group, kind=kind.kind)


def _about(kind: Kind, name: str, code: int, reason: str, what: str) -> ApiError:
    resource = f"{kind.plural}.{kind.group}" if kind.group else kind.plural
    message = f'{resource} "{name}" {what}'
    return ApiError(code, reason, message, name=name, group=kind.group, kind=kind.plural)


def _qualified(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _SUBDOMAIN.fullmatch(prefix)):
        return False
    return len(name) <= 63 and bool(_NAME_PART.fullmatch(name))


def _selector(text: str, field_selector: str) -> Callable[[Obj], bool]:
    """A predicate for equality-, set- and existence-based label selectors and the
    `metadata.name`/`metadata.namespace` field selectors."""
    tests: list[Callable[[Obj], bool]] = []
    for raw in re.split(r",(?![^()]*\))", text):
        term = raw.strip()
        if not term:
            continue
        tests.append(_label_term(term))
    for raw in field_selector.split(","):
        term = raw.strip()
        if term:
            tests.append(_field_term(term))
    return lambda obj: all(test(obj) for test in tests)


def _label_term(term: str) -> Callable[[Obj], bool]:
    def labels(obj: Obj) -> dict[str, str]:
        return obj.get("metadata", {}).get("labels") or {}

    if found := re.fullmatch(r"(\S+)\s+(in|notin)\s+\(([^)]*)\)", term):
        key, op, values = found[1], found[2], {v.strip() for v in found[3].split(",")}
        if op == "in":
            return lambda o: labels(o).get(key) in values
        return lambda o: labels(o).get(key) not in values
    if term.startswith("!"):
        return lambda o: term[1:] not in labels(o)
    if "!=" in term:
        key, value = term.split("!=", 1)
        return lambda o: labels(o).get(key) != value
    if "=" in term:
        key, value = re.split(r"==?", term, maxsplit=1)
        return lambda o: labels(o).get(key) == value
    return lambda o: term in labels(o)


def _field_term(term: str) -> Callable[[Obj], bool]:
    negate = "!=" in term
    key, value = re.split(r"!=|==?", term, maxsplit=1)
    if key not in ("metadata.name", "metadata.namespace"):
        raise ApiError(400, "BadRequest", f'field label not supported: "{key}"')
    attribute = key.split(".")[1]
    return lambda o: (o.get("metadata", {}).get(attribute) == value) != negate


def _validate(kind: Kind, obj: Obj) -> None:
    """What the API server's validation would reject first (a part of it), as 422 Invalid."""
    meta = obj.get("metadata") or {}
    name = meta.get("name") or ""
    problem = _metadata_problem(kind, meta) or _content_problem(kind, obj)
    if problem:
        raise _invalid(kind, name, *problem)


def _metadata_problem(kind: Kind, meta: Obj) -> tuple[str, str] | None:
    name = meta.get("name") or ""
    if len(name) > (63 if kind.kind == "Job" else 253) or not _SUBDOMAIN.fullmatch(name):
        return "metadata.name", f"Invalid value: {name!r}"
    for key, value in (meta.get("labels") or {}).items():
        if not _qualified(key) or len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
            return "metadata.labels", f"Invalid value: {key}={value!r}"
    bad = [key for key in meta.get("annotations") or {} if not _qualified(key)]
    if bad:
        return "metadata.annotations", f"Invalid value: {bad[0]!r}"
    for ref in meta.get("ownerReferences") or []:
        if not all(ref.get(f) for f in ("apiVersion", "kind", "name", "uid")):
            return "metadata.ownerReferences", "Required value"
    return None


def _content_problem(kind: Kind, obj: Obj) -> tuple[str, str] | None:
    for section in ("data", "stringData", "binaryData"):
        bad = [key for key in obj.get(section) or {} if not _DATA_KEY.fullmatch(key)]
        if bad:
            return f"{section}[{bad[0]}]", "Invalid value"
    spec = obj.get("spec") or {}
    if kind.kind == "Job":
        pod = spec.get("template", {}).get("spec") or {}
        if pod.get("restartPolicy") not in ("Never", "OnFailure"):
            return "spec.template.spec.restartPolicy", "Unsupported value"
        if not pod.get("containers") or not all(c.get("image") for c in pod["containers"]):
            return "spec.template.spec.containers", "Required value"
    if kind.kind == "NetworkPolicy" and not isinstance(spec.get("podSelector"), dict):
        return "spec.podSelector", "Required value"
    return None


def _merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict) or not isinstance(target, dict):
        return copy.deepcopy(patch)
    merged = dict(target)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = _merge(merged.get(key), value)
    return merged


class FakeKubernetesServer:
    """A fake Kubernetes API server (see the module's docstring).

    Example:
        async with FakeKubernetesServer(namespaces=["sandboxes"]) as server:
            backend = KubernetesBackend(KubernetesSettings(api_url=server.url, ...))
            ...
            server.finish_job(name, exit_code=0)
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        namespaces: Iterable[str] = ("default",),
        git_version: str = "v1.34.0-suzumio-fake",
    ) -> None:
        self.host, self.port, self.git_version = host, port, git_version
        self.namespaces: set[str] = set(namespaces)
        self.requests: list[RecordedCall] = []
        self.fail_watches = False
        """When true, every watch request is answered 500 (clients must fall back to polling)."""
        self.pod_grace = 0.0
        """Seconds a deleted pod stays (terminating, `deletionTimestamp` set) before it is
        gone, as a kubelet's stop takes its grace period; 0: gone at once."""
        self._objects: dict[tuple[str, str, str], Obj] = {}
        self._history: list[tuple[int, str, str, Obj]] = []
        self._watchers: set[_Watcher] = set()
        self._version = 0
        self.app = Starlette(
            routes=[Route("/{path:path}", self._handle, methods=["GET", "POST", "PATCH", "DELETE"])]
        )
        self._http = InProcessServer(self.app, host, port)

    @property
    def url(self) -> str:
        if not self._http.serving:
            raise RuntimeError("the fake Kubernetes API server is not started")
        return f"http://{self.host}:{self.port}"

    # -- test controls -----------------------------------------------------------------------

    def objects(self, kind: str, namespace: str | None = None) -> list[Obj]:
        """Copies of the stored objects of a kind (`Job` or `jobs`), by name."""
        plural = _BY_NAME[kind].plural
        return [
            copy.deepcopy(obj)
            for (p, ns, _), obj in sorted(self._objects.items())
            if p == plural and namespace in (None, ns)
        ]

    def finish_job(
        self, name: str, exit_code: int = 0, reason: str | None = None, namespace: str | None = None
    ) -> None:
        """End a Job as the Job controller and the kubelet would.

        `reason`: `DeadlineExceeded` fails the Job on its deadline (its pod is deleted);
        `Evicted` evicts the pod; anything else (`OOMKilled`, …) is the container's
        terminated reason. The Job succeeds when `exit_code` is 0 and `reason` is None.
        """
        job = self._find_job(name, namespace)
        ns = job["metadata"]["namespace"]
        if reason != "DeadlineExceeded" and self._pod_of(job) is None:
            self._start_job(job)
            job = self._find_job(name, namespace)
        pod = self._pod_of(job)
        if reason == "DeadlineExceeded":
            if pod is not None:
                self._delete(_BY_NAME["Pod"], ns, pod["metadata"]["name"], "Background")
            message = "Job was active longer than specified deadline"
            status = self._job_failed(job, reason, message)
        else:
            assert pod is not None
            self._end_pod(pod, exit_code, reason)
            if exit_code == 0 and reason is None:
                status = {**job.get("status", {}), "active": 0, "succeeded": 1}
                status["completionTime"] = _now()
                status["conditions"] = [
                    self._condition(t, "CompletionsReached", "")
                    for t in ("SuccessCriteriaMet", "Complete")
                ]
            else:
                message = "Job has reached the specified backoff limit"
                status = self._job_failed(job, "BackoffLimitExceeded", message)
        self._store(_BY_NAME["Job"], {**job, "status": status}, "MODIFIED")

    def stall_pod(
        self, name: str, reason: str, message: str = "", namespace: str | None = None
    ) -> None:
        """Leave the pod of Job `name` pending, as the kubelet or the scheduler would:
        `Unschedulable` is the scheduler's (`PodScheduled` False, no container status), any
        other reason (`ImagePullBackOff`, `InvalidImageName`, …) the runner container's
        `waiting` state. A later `finish_job` still ends it."""
        job = self._find_job(name, namespace)
        pod = self._pod_of(job)
        assert pod is not None, f"Job {name!r} has no pod (suspended?)"
        pod = copy.deepcopy(pod)
        if reason == "Unschedulable":
            condition = self._condition("PodScheduled", reason, message) | {"status": "False"}
            pod["status"] = {"phase": "Pending", "conditions": [condition]}
        else:
            waiting = {"waiting": {"reason": reason, "message": message}}
            pod["status"] = {
                "phase": "Pending",
                "containerStatuses": [
                    status | {"ready": False, "started": False, "state": waiting}
                    for status in self._container_statuses(pod["spec"]["containers"], {})
                ],
            }
        self._store(_BY_NAME["Pod"], pod, "MODIFIED")

    def _find_job(self, name: str, namespace: str | None) -> Obj:
        for (plural, ns, found), obj in self._objects.items():
            if plural == "jobs" and found == name and namespace in (None, ns):
                return obj
        raise KeyError(f"no Job {name!r}")

    def _pod_of(self, job: Obj) -> Obj | None:
        ns, uid = job["metadata"]["namespace"], job["metadata"]["uid"]
        for (plural, found_ns, _), obj in self._objects.items():
            refs = obj["metadata"].get("ownerReferences") or []
            if plural == "pods" and found_ns == ns and any(r["uid"] == uid for r in refs):
                return obj
        return None

    @staticmethod
    def _condition(kind: str, reason: str, message: str) -> Obj:
        now = _now()
        return {
            "type": kind,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastProbeTime": now,
            "lastTransitionTime": now,
        }

    def _job_failed(self, job: Obj, reason: str, message: str) -> Obj:
        status = {**job.get("status", {}), "active": 0, "failed": 1}
        status["conditions"] = [
            self._condition(t, reason, message) for t in ("FailureTarget", "Failed")
        ]
        return status

    def _end_pod(self, pod: Obj, exit_code: int, reason: str | None) -> Obj:
        pod = copy.deepcopy(pod)
        now = _now()
        if reason == "Evicted":
            message = "The node was low on resource: ephemeral-storage."
            pod["status"] = {"phase": "Failed", "reason": "Evicted", "message": message}
        else:
            terminated = {"exitCode": exit_code, "startedAt": now, "finishedAt": now}
            terminated["reason"] = reason or ("Completed" if exit_code == 0 else "Error")
            pod["status"]["phase"] = "Succeeded" if exit_code == 0 and not reason else "Failed"
            if not pod["status"].get("containerStatuses"):  # stalled before any started
                containers = pod["spec"]["containers"]
                pod["status"]["containerStatuses"] = self._container_statuses(containers, {})
            for status in pod["status"]["containerStatuses"]:
                status |= {"ready": False, "started": False, "state": {"terminated": terminated}}
        return self._store(_BY_NAME["Pod"], pod, "MODIFIED")

    @staticmethod
    def _container_statuses(containers: list[Obj], state: Obj) -> list[Obj]:
        return [
            {
                "name": c["name"],
                "image": c["image"],
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "started": True,
                "state": copy.deepcopy(state),
            }
            for c in containers
        ]

    def _stop_job(self, job: Obj) -> Obj:
        """What the Job controller does for a running Job that is suspended: its pods go."""
        ns = job["metadata"]["namespace"]
        while (pod := self._pod_of(job)) is not None:
            self._delete(_BY_NAME["Pod"], ns, pod["metadata"]["name"], "Background")
        status = {**job.get("status", {}), "active": 0}
        status["conditions"] = [self._condition("Suspended", "JobSuspended", "Job suspended")]
        return self._store(_BY_NAME["Job"], {**job, "status": status}, "MODIFIED")

    def _start_job(self, job: Obj) -> None:
        """What the Job controller and kubelet do for a Job that is not suspended."""
        job = copy.deepcopy(job)
        job["status"] = {**job.get("status", {}), "active": 1, "startTime": _now()}
        self._store(_BY_NAME["Job"], job, "MODIFIED")
        meta = job["metadata"]
        template = copy.deepcopy(job["spec"]["template"])
        owner = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        pod_meta = {**template.get("metadata", {}), "ownerReferences": [owner]}
        pod_meta["name"] = f"{meta['name']}-{secrets.token_hex(3)[:5]}"
        running = {"running": {"startedAt": _now()}}
        pod_status = {
            "phase": "Running",
            "containerStatuses": self._container_statuses(template["spec"]["containers"], running),
        }
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": template["spec"]}
        admitted = self._admit(_BY_NAME["Pod"], pod, meta["namespace"])
        self._store(_BY_NAME["Pod"], {**admitted, "status": pod_status}, "ADDED")

    # -- storage, events, garbage collection -------------------------------------------------

    def _store(self, kind: Kind, obj: Obj, event: str) -> Obj:
        self._version += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self._version)
        meta = obj["metadata"]
        key = (kind.plural, meta["namespace"], meta["name"])
        if event == "DELETED":
            self._objects.pop(key, None)
        else:
            self._objects[key] = obj
        self._history.append((self._version, kind.plural, event, copy.deepcopy(obj)))
        for watcher in self._watchers:
            ours = watcher.kind == kind and watcher.namespace == meta["namespace"]
            if ours and watcher.matches(obj):
                watcher.queue.put_nowait((event, copy.deepcopy(obj)))
        return obj

    def _uids(self, namespace: str) -> set[str]:
        return {o["metadata"]["uid"] for (_, ns, _), o in self._objects.items() if ns == namespace}

    def _delete(self, kind: Kind, namespace: str, name: str, propagation: str) -> Obj:
        obj = self._objects[(kind.plural, namespace, name)]
        if kind.plural == "pods" and self.pod_grace > 0:
            return self._terminate(kind, obj)
        gone = self._store(kind, obj, "DELETED")
        uid = obj["metadata"]["uid"]
        for (plural, ns, dependent), other in list(self._objects.items()):
            refs = other["metadata"].get("ownerReferences") or []
            if ns != namespace or not any(r.get("uid") == uid for r in refs):
                continue
            if propagation == "Orphan":
                kept = [r for r in refs if r.get("uid") != uid]
                orphan = _merge(other, {"metadata": {"ownerReferences": kept or None}})
                self._store(_BY_NAME[plural], orphan, "MODIFIED")
            elif (plural, ns, dependent) in self._objects:
                self._delete(_BY_NAME[plural], ns, dependent, "Background")
        return gone

    def _terminate(self, kind: Kind, pod: Obj) -> Obj:
        """A pod's deletion as a kubelet takes it: terminating for `pod_grace`, then gone."""
        if pod["metadata"].get("deletionTimestamp"):
            return pod
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        terminating = self._store(
            kind, _merge(pod, {"metadata": {"deletionTimestamp": stamp}}), "MODIFIED"
        )
        key = (kind.plural, pod["metadata"]["namespace"], pod["metadata"]["name"])

        def gone() -> None:
            current = self._objects.get(key)
            if current is not None and current["metadata"]["uid"] == pod["metadata"]["uid"]:
                self._store(kind, current, "DELETED")

        asyncio.get_running_loop().call_later(self.pod_grace, gone)
        return terminating

    # -- HTTP --------------------------------------------------------------------------------

    async def _handle(self, request: Request) -> Response:
        query = dict(request.query_params)
        self.requests.append(RecordedCall(request.method, request.url.path, query))
        try:
            return await self._route(request, query)
        except ApiError as error:
            return JSONResponse(error.status(), status_code=error.code)

    async def _route(self, request: Request, query: dict[str, str]) -> Response:
        parts = [p for p in request.url.path.split("/") if p]
        if parts == ["version"]:
            return JSONResponse(self._version_info())
        if parts[:2] == ["api", "v1"]:
            api_version, rest = "v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            api_version, rest = f"{parts[1]}/{parts[2]}", parts[3:]
        else:
            raise ApiError(404, "NotFound", _NO_RESOURCE)
        if len(rest) == 2 and rest[0] == "namespaces" and api_version == "v1":
            return JSONResponse(self._namespace(rest[1]))
        kind = _BY_PATH.get((api_version, rest[2])) if len(rest) in (3, 4) else None
        if kind is None or rest[0] != "namespaces":
            raise ApiError(404, "NotFound", _NO_RESOURCE)
        if len(rest) == 3:
            return await self._collection(request, kind, rest[1], query)
        return await self._object(request, kind, rest[1], rest[3], query)

    async def _collection(
        self, request: Request, kind: Kind, namespace: str, query: dict[str, str]
    ) -> Response:
        dry_run = self._dry_run(query)
        if request.method == "POST":
            created = self._create(kind, namespace, await self._body(request), dry_run)
            return JSONResponse(created, status_code=201)
        if request.method != "GET":
            raise ApiError(405, "MethodNotAllowed", f"{request.method} is not supported here")
        if query.get("watch") in _TRUE:
            return self._watch(kind, namespace, query)
        return JSONResponse(self._list(kind, namespace, query))

    async def _object(
        self, request: Request, kind: Kind, namespace: str, name: str, query: dict[str, str]
    ) -> Response:
        dry_run = self._dry_run(query)
        if request.method == "GET":
            return JSONResponse(self._get(kind, namespace, name))
        if request.method == "PATCH":
            body = await self._body(request)
            return JSONResponse(self._patch(kind, namespace, name, body, dry_run))
        if request.method != "DELETE":
            raise ApiError(405, "MethodNotAllowed", f"{request.method} is not supported here")
        raw = await request.body()
        options = json.loads(raw) if raw else {}
        policy = query.get("propagationPolicy") or options.get("propagationPolicy")
        return JSONResponse(self._delete_request(kind, namespace, name, policy, dry_run))

    @staticmethod
    async def _body(request: Request) -> Obj:
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ApiError(415, "UnsupportedMediaType", "only merge patches are supported")
        return body

    @staticmethod
    def _dry_run(query: dict[str, str]) -> bool:
        value = query.get("dryRun")
        if value not in (None, "All"):
            raise ApiError(400, "BadRequest", f"Invalid dry run value: {value}")
        return value == "All"

    def _version_info(self) -> Obj:
        major, minor = self.git_version.lstrip("v").split(".")[:2]
        return {
            "major": major,
            "minor": minor,
            "gitVersion": self.git_version,
            "gitCommit": "0" * 40,
            "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z",
            "goVersion": "go1.24.0",
            "compiler": "gc",
            "platform": "linux/amd64",
        }

    def _namespace(self, name: str) -> Obj:
        if name not in self.namespaces:
            raise ApiError(
                404, "NotFound", f'namespaces "{name}" not found', name=name, kind="namespaces"
            )
        meta = {
            "name": name,
            "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
            "labels": {"kubernetes.io/metadata.name": name},
        }
        return {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": meta,
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }

    def _get(self, kind: Kind, namespace: str, name: str) -> Obj:
        found = self._objects.get((kind.plural, namespace, name))
        if found is None:
            raise _about(kind, name, 404, "NotFound", "not found")
        return copy.deepcopy(found)

    def _list(self, kind: Kind, namespace: str, query: dict[str, str]) -> Obj:
        matches = _selector(query.get("labelSelector", ""), query.get("fieldSelector", ""))
        items = [o for o in self.objects(kind.kind, namespace) if matches(o)]
        meta = {"resourceVersion": str(self._version)}
        return {
            "apiVersion": kind.api_version,
            "kind": f"{kind.kind}List",
            "metadata": meta,
            "items": items,
        }

    def _watch(self, kind: Kind, namespace: str, query: dict[str, str]) -> Response:
        if self.fail_watches:
            raise ApiError(500, "InternalError", "watch is failing (a test control)")
        matches = _selector(query.get("labelSelector", ""), query.get("fieldSelector", ""))
        watcher = _Watcher(kind, namespace, matches)
        since = query.get("resourceVersion") or "0"
        if since == "0":
            backlog = [("ADDED", o) for o in self.objects(kind.kind, namespace) if matches(o)]
        else:
            backlog = [
                (event, copy.deepcopy(obj))
                for version, plural, event, obj in self._history
                if version > int(since)
                and plural == kind.plural
                and obj["metadata"]["namespace"] == namespace
                and matches(obj)
            ]
        self._watchers.add(watcher)
        timeout = float(query.get("timeoutSeconds") or 1_800)
        return StreamingResponse(
            self._events(watcher, backlog, timeout), media_type="application/json"
        )

    async def _events(
        self, watcher: _Watcher, backlog: list[tuple[str, Obj]], timeout: float
    ) -> AsyncIterator[bytes]:
        try:
            for event, obj in backlog:
                yield json.dumps({"type": event, "object": obj}).encode() + b"\n"
            async with asyncio.timeout(timeout):
                while (item := await watcher.queue.get()) is not None:
                    yield json.dumps({"type": item[0], "object": item[1]}).encode() + b"\n"
        except TimeoutError:
            return
        finally:
            self._watchers.discard(watcher)

    def _create(self, kind: Kind, namespace: str, body: Obj, dry_run: bool) -> Obj:
        if body.get("kind") != kind.kind or body.get("apiVersion") != kind.api_version:
            got = f"{body.get('apiVersion')} {body.get('kind')}"
            raise ApiError(400, "BadRequest", f"expected {kind.api_version} {kind.kind}, got {got}")
        meta = body.get("metadata") or {}
        if meta.get("namespace", namespace) != namespace:
            message = "the namespace of the provided object does not match the namespace sent "
            raise ApiError(400, "BadRequest", message + "on the request")
        _validate(kind, body)
        self._namespace(namespace)
        name = meta["name"]
        if (kind.plural, namespace, name) in self._objects:
            raise _about(kind, name, 409, "AlreadyExists", "already exists")
        obj = self._admit(kind, body, namespace)
        if dry_run:
            return obj
        stored = self._store(kind, obj, "ADDED")
        refs = meta.get("ownerReferences") or []
        if refs and not {r["uid"] for r in refs} & self._uids(namespace):
            self._delete(kind, namespace, name, "Background")  # its owner does not exist
        elif kind.kind == "Job" and not stored["spec"].get("suspend"):
            self._start_job(stored)
        return stored

    def _admit(self, kind: Kind, body: Obj, namespace: str) -> Obj:
        obj = copy.deepcopy(body)
        obj["metadata"] = {
            **obj.get("metadata", {}),
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            "creationTimestamp": _now(),
        }
        if kind.kind == "Secret":
            data = dict(obj.get("data") or {})
            for key, value in (obj.pop("stringData", None) or {}).items():
                data[key] = base64.b64encode(value.encode()).decode()
            obj["data"] = data
            obj.setdefault("type", "Opaque")
        if kind.kind == "Job":
            uid, name = obj["metadata"]["uid"], obj["metadata"]["name"]
            spec = obj["spec"]
            for key, default in (
                ("completions", 1),
                ("parallelism", 1),
                ("backoffLimit", 6),
                ("suspend", False),
            ):
                spec.setdefault(key, default)
            spec["selector"] = {"matchLabels": {_UID_LABELS[0]: uid}}
            labels = spec["template"].setdefault("metadata", {}).setdefault("labels", {})
            labels |= dict.fromkeys(_UID_LABELS, uid) | dict.fromkeys(_JOB_NAME_LABELS, name)
            obj["status"] = {}
        return obj

    def _patch(self, kind: Kind, namespace: str, name: str, patch: Obj, dry_run: bool) -> Obj:
        current = self._get(kind, namespace, name)
        merged: Obj = _merge(current, patch)
        merged["metadata"] |= {
            k: current["metadata"][k] for k in ("name", "namespace", "uid", "creationTimestamp")
        }
        _validate(kind, merged)
        if current.get("immutable") and any(
            current.get(k) != merged.get(k) for k in ("data", "binaryData", "immutable")
        ):
            raise _invalid(
                kind, name, "data", "Forbidden: field is immutable when `immutable` is set"
            )
        if dry_run:
            return merged
        stored = self._store(kind, merged, "MODIFIED")
        if (
            kind.kind == "Job"
            and current["spec"].get("suspend")
            and not stored["spec"].get("suspend")
        ):
            self._start_job(stored)
            stored = self._get(kind, namespace, name)
        elif (
            kind.kind == "Job"
            and not current["spec"].get("suspend")
            and stored["spec"].get("suspend")
        ):
            stored = self._stop_job(stored)
        return stored

    def _delete_request(
        self, kind: Kind, namespace: str, name: str, policy: str | None, dry_run: bool
    ) -> Obj:
        obj = self._get(kind, namespace, name)
        if policy not in (None, "Orphan", "Background", "Foreground"):
            raise ApiError(400, "BadRequest", f"invalid propagationPolicy: {policy}")
        if not dry_run:
            self._delete(kind, namespace, name, policy or kind.default_propagation)
        details = {
            "name": name,
            "group": kind.group,
            "kind": kind.plural,
            "uid": obj["metadata"]["uid"],
        }
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": details,
        }

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> Self:
        self.port = await self._http.start("fake Kubernetes API server")
        return self

    async def close(self) -> None:
        """Stop: open watch streams end, connections are closed."""
        for watcher in list(self._watchers):
            watcher.queue.put_nowait(None)
        await self._http.stop()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
