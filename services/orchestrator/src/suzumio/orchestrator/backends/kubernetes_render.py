"""The Kubernetes objects of one activation (DESIGN.md §8, §10), rendered without any I/O.

Per activation: a Job (created first, suspended), a Secret, a ConfigMap and a NetworkPolicy,
all four named alike (`resource_name`) and the last three owned by the Job, so deleting the Job
deletes the rest.

Where the token lives: the runner reads its token from `/activation/input.json` and the token is
a credential, so the whole input file is a key of the **Secret** (`input.json`), mounted
read-only at `/activation` with only that key projected. The Secret also holds the provider
keys (`plan.secret_keys`), each handed to the container through its own `secretKeyRef` (never
`envFrom`: that would turn the `input.json` key into an environment variable). The
**ConfigMap** holds the rest of the environment (ids, model endpoints), read with `envFrom`;
nothing in it is secret. `redact` replaces every Secret value (and the token inside the input)
with `***` for dry runs and logs.

The Job is rendered with `suspend: true`: the backend resumes it once its Secret, ConfigMap
and NetworkPolicy exist, so its pod never runs without its network policy or its input.
"""

from __future__ import annotations

import copy
import hashlib
import ipaddress
import json
import os
import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from suzumio.contracts.values import NetworkProfile
from suzumio.orchestrator.backends.base import (
    INPUT_PATH,
    LABEL_PREFIX,
    WORKSPACE,
    CleanupPolicy,
    LaunchPlan,
    labels_for,
)

Manifest = dict[str, Any]

DOMAIN = "suzumio.io"
MANAGED_LABEL = f"{DOMAIN}/managed"
NAMESPACE_LABEL = f"{DOMAIN}/namespace"
JOB_LABEL = f"{DOMAIN}/job"
ACTIVATION_ANNOTATION = f"{DOMAIN}/activation"
INSTALLATION_ANNOTATION = f"{DOMAIN}/installation"
CONTAINER = "runner"
INPUT_KEY = "input.json"
ACTIVATION_DIR = str(Path(INPUT_PATH).parent)
REDACTED = "***"
MAX_SECRET_BYTES = 1_048_576  # the API server's limit on a Secret's data
PENDING_UID = "00000000-0000-0000-0000-000000000000"
"""The Job's uid in owner references until the Job exists (the backend fills in the real one)."""

PRIVATE_CIDRS = (
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "169.254.0.0/16",  # link-local: the cloud metadata services (169.254.169.254)
    "100.64.0.0/10",  # carrier-grade NAT, also some clusters' pod and service ranges
    "127.0.0.0/8",
    "fc00::/7",
    "fe80::/10",
    "::1/128",
)
"""What network 'egress' keeps pods from by default: the cluster (pods, services, the API
server), the node, the metadata service and anything else on a private network."""

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class KubernetesSettings(BaseModel):
    """Where and how the kubernetes backend runs activations."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str = Field(default="suzumio-sandboxes", pattern=_DNS_LABEL.pattern, max_length=63)
    api_url: str | None = Field(
        default=None, description="API server URL without auth (`kubectl proxy`, a test server)"
    )
    kubeconfig: Path | None = Field(default=None, description="default: ~/.kube/config")
    context: str | None = None
    in_cluster: bool = Field(default=False, description="use the pod's service account")
    image: str | None = Field(default=None, description="when the runtime profile names none")
    command: tuple[str, ...] = Field(default=(), description="when the profile has no entry")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    service_account: str | None = Field(default=None, description="none: the namespace default")
    runtime_class: str | None = Field(default=None, description="e.g. gvisor or kata")
    ttl_seconds_after_finished: int | None = Field(default=3_600, ge=0)
    stop_grace_seconds: int = Field(
        default=5,
        ge=0,
        le=300,
        description="SIGTERM → SIGKILL of a sandbox's pod (its terminationGracePeriodSeconds; "
        "Kubernetes' own default is 30 s): a cancel waits this long, and a little more, for "
        "the pod to be gone",
    )
    run_as_user: int = Field(default=65_534, ge=1)
    run_as_group: int = Field(default=65_534, ge=1)
    fs_group: int = Field(default=65_534, ge=1)
    broker_url: str | None = Field(
        default=None, description="the tool-broker as pods reach it (replaces controller_url)"
    )
    egress_cidrs: tuple[str, ...] = Field(
        default=(),
        description="network 'egress': where pods may go (none: the internet, no private range)",
    )
    private_cidrs: tuple[str, ...] = Field(
        default=PRIVATE_CIDRS,
        description="network 'egress' without egress_cidrs: what 'the internet' leaves out",
    )
    internal_cidrs: tuple[str, ...] = Field(
        default=(),
        description="network 'egress': private addresses pods may still reach (a broker or a "
        "model server on the node); the broker_url's address is added when it is an IP",
    )
    broker_pod_labels: dict[str, str] = Field(
        default_factory=dict, description="network 'egress': the tool-broker's pods"
    )
    broker_namespace: str | None = None
    dns_namespace: str = Field(
        default="kube-system", description="network 'egress': where the cluster DNS runs"
    )
    dns_pod_labels: dict[str, str] = Field(
        default_factory=lambda: {"k8s-app": "kube-dns"},
        description="network 'egress': the cluster DNS's pods (the only DNS pods may ask)",
    )
    dns_cidrs: tuple[str, ...] = Field(
        default=("169.254.20.10/32",),
        description="network 'egress': DNS servers pods may ask besides the cluster DNS's pods "
        "(port 53 only; default: NodeLocal DNSCache's address)",
    )
    tmp_size_mb: int = Field(default=256, ge=16)
    host_paths: bool = Field(
        default=False,
        description="single-node clusters: workspace, session dir and mounts as hostPath",
    )
    cleanup: CleanupPolicy = "always"
    request_timeout_seconds: float = Field(default=30.0, gt=0)
    watch_timeout_seconds: int = Field(default=60, ge=1, description="one watch request")
    api_connections: int = Field(
        default=100,
        ge=1,
        description="connections to the API server for requests (launch, cancel, list); "
        "watches, two long polls per watched Job, have connections of their own",
    )
    watch_connections: int = Field(
        default=1_000,
        ge=2,
        description="connections for the watches (two per watched Job; past them, watches "
        "wait for one another, never the requests): mind the process's open-files limit",
    )
    start_grace_seconds: int = Field(
        default=120,
        ge=0,
        description="a failed image pull or CreateContainerError: how long before the pod is "
        "given up (the activation fails, retryable)",
    )
    unschedulable_grace_seconds: int = Field(
        default=600, ge=0, description="a pod no node can take: how long before it is given up"
    )

    @field_validator("egress_cidrs", "private_cidrs", "internal_cidrs")
    @classmethod
    def _cidrs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(str(ipaddress.ip_network(cidr, strict=False)) for cidr in value)


def _digest(text: str, size: int = 10) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:size]


def resource_name(activation_id: str, attempt: int) -> str:
    """`sz-<activation id>-<attempt>`, a DNS-1123 label of at most 63 characters.

    A UUID keeps its full text (its first 8 hex digits are a timestamp shared by every
    activation of the same minute); any other id is cleaned, shortened and made unique by
    a digest of the original."""
    suffix = f"-{attempt}"
    plain = f"sz-{activation_id}{suffix}"
    if _DNS_LABEL.fullmatch(activation_id) and len(plain) <= 63:
        return plain
    digest = _digest(activation_id)
    cleaned = re.sub(r"[^a-z0-9]+", "-", activation_id.lower()).strip("-")
    room = 63 - len(f"sz--{digest}{suffix}")
    head = cleaned[:room].strip("-")
    return f"sz-{head}-{digest}{suffix}" if head else f"sz-{digest}{suffix}"


def label_value(value: str) -> str:
    """`value` if it is a valid label value, else a cleaned prefix plus a digest of it."""
    if len(value) <= 63 and _LABEL_VALUE.fullmatch(value):
        return value
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", value)[:52]
    cleaned = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", cleaned)
    return f"{cleaned}-{_digest(value)}" if cleaned else _digest(value)


def selector_for(namespace: str) -> str:
    """The label selector of every Job this platform namespace created."""
    return f"{MANAGED_LABEL}=true,{NAMESPACE_LABEL}={label_value(namespace or '-')}"


def _k8s_key(key: str) -> str:
    return f"{DOMAIN}/{key.removeprefix(LABEL_PREFIX + '.')}"


def _metadata(
    plan: LaunchPlan, settings: KubernetesSettings, namespace: str, installation: str | None
) -> Manifest:
    name = resource_name(plan.activation_id, plan.attempt)
    ours = labels_for(plan, namespace, installation)
    labels = {_k8s_key(k): label_value(v) for k, v in ours.items()} | {JOB_LABEL: name}
    annotations = {_k8s_key(k): v for k, v in ours.items()}  # the exact ids, for list_live
    extra = {k: v for k, v in plan.labels.items() if k not in ours}
    if extra:  # free-form: not necessarily valid label keys or values
        annotations[f"{DOMAIN}/labels"] = json.dumps(extra, sort_keys=True)
    return {
        "name": name,
        "namespace": settings.namespace,
        "labels": labels,
        "annotations": annotations,
    }


def owner_reference(job_name: str, uid: str) -> Manifest:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": job_name,
        "uid": uid,
        "controller": True,
    }


def with_owner_uid(manifest: Manifest, uid: str) -> Manifest:
    """A copy of a dependent's manifest owned by the Job with this uid."""
    owned = copy.deepcopy(manifest)
    for ref in owned["metadata"].get("ownerReferences", []):
        ref["uid"] = uid
    return owned


def render(
    plan: LaunchPlan,
    settings: KubernetesSettings,
    *,
    namespace: str = "",
    installation: str | None = None,
    job_uid: str = PENDING_UID,
) -> list[Manifest]:
    """Job, Secret, ConfigMap and NetworkPolicy, in the order they are created.

    Raises:
        ValueError: the plan cannot run here (no image, an invalid env name, host mounts on a
            cluster without `host_paths`, an input larger than a Secret can hold).
    """
    for key in plan.env:
        if not _ENV_NAME.fullmatch(key):
            raise ValueError(f"not a valid environment variable name: {key!r}")
    meta = _metadata(plan, settings, namespace, installation)
    owned = {**copy.deepcopy(meta), "ownerReferences": [owner_reference(meta["name"], job_uid)]}
    return [
        _job(plan, settings, meta),
        _secret(plan, settings, owned),
        _config_map(plan, copy.deepcopy(owned)),
        network_policy(plan.profile.network, settings, copy.deepcopy(owned)),
    ]


def _secret(plan: LaunchPlan, settings: KubernetesSettings, meta: Manifest) -> Manifest:
    update: dict[str, Any] = {"workspace": WORKSPACE}
    if settings.broker_url:
        update["controller_url"] = settings.broker_url
    runner_input = plan.input.model_copy(update=update).model_dump_json()
    keys = {k: plan.env[k] for k in sorted(plan.secret_keys) if k in plan.env}
    size = sum(len(v.encode()) for v in (runner_input, *keys.values()))
    if size > MAX_SECRET_BYTES:
        raise ValueError(f"the input is too large for a Secret: {size} bytes (1 MiB at most)")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        "immutable": True,
        "stringData": {INPUT_KEY: runner_input, **keys},
    }


def _config_map(plan: LaunchPlan, meta: Manifest) -> Manifest:
    data = {"HOME": "/tmp"}  # noqa: S108 - the root filesystem is read-only
    data |= {k: v for k, v in sorted(plan.env.items()) if k not in plan.secret_keys}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "immutable": True,
        "data": data,
    }


def _job(plan: LaunchPlan, settings: KubernetesSettings, meta: Manifest) -> Manifest:
    spec: Manifest = {
        "backoffLimit": 0,
        "suspend": True,
        "activeDeadlineSeconds": plan.profile.timeouts.wall_clock_seconds,
        "template": {
            "metadata": {"labels": dict(meta["labels"]), "annotations": dict(meta["annotations"])},
            "spec": _pod_spec(plan, settings, meta["name"]),
        },
    }
    if settings.ttl_seconds_after_finished is not None:
        spec["ttlSecondsAfterFinished"] = settings.ttl_seconds_after_finished
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": copy.deepcopy(meta), "spec": spec}


def runner_owner(settings: KubernetesSettings) -> tuple[int, int]:
    """The user and group the runner runs as: the configured ones — except with `host_paths`
    and an orchestrator that is not root, which cannot give the node's directories to
    another user: then its own, as the docker backend does (opening them to all instead let
    every local user of the node read and write what the agents wrote)."""
    if settings.host_paths and os.geteuid() != 0:
        return os.geteuid(), os.getegid()
    return settings.run_as_user, settings.run_as_group


def _runner_ids(settings: KubernetesSettings) -> dict[str, int]:
    uid, gid = runner_owner(settings)
    fs_group = settings.fs_group if gid == settings.run_as_group else gid
    return {"runAsUser": uid, "runAsGroup": gid, "fsGroup": fs_group}


def _pod_spec(plan: LaunchPlan, settings: KubernetesSettings, name: str) -> Manifest:
    volumes, mounts = _volumes(plan, settings, name)
    spec: Manifest = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": settings.stop_grace_seconds,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,  # no service addresses in the env: only what the plan says
        "securityContext": {
            "runAsNonRoot": True,
            **_runner_ids(settings),
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(plan, settings, name, mounts)],
        "volumes": volumes,
    }
    if settings.service_account:
        spec["serviceAccountName"] = settings.service_account
    if settings.runtime_class:
        spec["runtimeClassName"] = settings.runtime_class
    return spec


def _container(
    plan: LaunchPlan, settings: KubernetesSettings, name: str, mounts: list[Manifest]
) -> Manifest:
    image = plan.profile.image or settings.image
    if not image:
        raise ValueError("no image: neither the runtime profile nor the settings name one")
    limits = plan.profile.limits
    # Kubernetes has no per-pod pids limit (that is the kubelet's podPidsLimit): not rendered.
    resources = {
        "cpu": f"{max(1, round(limits.cpus * 1000))}m",
        "memory": f"{limits.memory_mb}Mi",
        "ephemeral-storage": f"{limits.disk_mb}Mi",
    }
    secret_env = [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": name, "key": k}}}
        for k in sorted(plan.secret_keys)
        if k in plan.env
    ]
    container: Manifest = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "workingDir": WORKSPACE,
        "envFrom": [{"configMapRef": {"name": name}}],
        "env": secret_env,
        "resources": {"requests": dict(resources), "limits": resources},
        "securityContext": {
            "runAsNonRoot": True,
            "privileged": False,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": mounts,
    }
    command = list(plan.profile.entry or settings.command)
    if command:
        container["command"] = command
    return container


def _volumes(
    plan: LaunchPlan, settings: KubernetesSettings, name: str
) -> tuple[list[Manifest], list[Manifest]]:
    disk = plan.profile.limits.disk_mb
    activation = {"secretName": name, "items": [{"key": INPUT_KEY, "path": INPUT_KEY}]}
    if settings.host_paths:
        workspace: Manifest = {
            "hostPath": {"path": str(plan.host_dir / "workspace"), "type": "Directory"}
        }
    else:
        workspace = {"emptyDir": {"sizeLimit": f"{disk}Mi"}}
    volumes: list[Manifest] = [
        {"name": "activation", "secret": {**activation, "defaultMode": 0o440}},
        {"name": "workspace", **workspace},
        {"name": "tmp", "emptyDir": {"sizeLimit": f"{min(settings.tmp_size_mb, disk)}Mi"}},
    ]
    mounts: list[Manifest] = [
        {"name": "activation", "mountPath": ACTIVATION_DIR, "readOnly": True},
        {"name": "workspace", "mountPath": WORKSPACE},
        {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 - the sandbox's own scratch volume
    ]
    if not settings.host_paths:
        if plan.mounts:
            raise ValueError("mount grants need host_paths (a single-node cluster)")
        return volumes, mounts
    volumes.append(
        {
            "name": "session",
            "hostPath": {"path": str(plan.session_dir), "type": "DirectoryOrCreate"},
        }
    )
    mounts.append({"name": "session", "mountPath": f"{WORKSPACE}/session"})
    for index, grant in enumerate(plan.mounts):
        volumes.append(
            {
                "name": f"mount-{index}",
                "hostPath": {"path": str(grant.host_path), "type": "Directory"},
            }
        )
        mounts.append(
            {"name": f"mount-{index}", "mountPath": grant.target, "readOnly": not grant.writable}
        )
    return volumes, mounts


def network_policy(
    profile: NetworkProfile, settings: KubernetesSettings, meta: Manifest
) -> Manifest:
    """none: nothing in or out; egress: nothing in, out to the cluster DNS, the broker and the
    configured CIDRs (the internet, no private range, when none is configured); full:
    everything in and out."""
    spec: Manifest = {
        "podSelector": {"matchLabels": {JOB_LABEL: meta["name"]}},
        "policyTypes": ["Ingress", "Egress"],
    }
    if profile is NetworkProfile.FULL:
        spec |= {"ingress": [{}], "egress": [{}]}
    elif profile is NetworkProfile.EGRESS:
        spec["egress"] = _egress_rules(settings)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": spec,
    }


def _egress_rules(settings: KubernetesSettings) -> list[Manifest]:
    # DNS only to the cluster's DNS pods: port 53 anywhere would be a tunnel to any host.
    dns_peer: Manifest = {
        "namespaceSelector": {
            "matchLabels": {"kubernetes.io/metadata.name": settings.dns_namespace}
        },
        "podSelector": {"matchLabels": dict(settings.dns_pod_labels)},
    }
    dns_peers = [dns_peer, *({"ipBlock": {"cidr": cidr}} for cidr in settings.dns_cidrs)]
    dns = {"to": dns_peers, "ports": [{"protocol": p, "port": 53} for p in ("UDP", "TCP")]}
    if settings.egress_cidrs:
        places = [{"ipBlock": {"cidr": cidr}} for cidr in settings.egress_cidrs]
    else:
        places = _internet(settings.private_cidrs)
    rules: list[Manifest] = [dns, {"to": places}]
    if settings.broker_pod_labels:
        peer: Manifest = {"podSelector": {"matchLabels": dict(settings.broker_pod_labels)}}
        if settings.broker_namespace:
            match = {"kubernetes.io/metadata.name": settings.broker_namespace}
            peer["namespaceSelector"] = {"matchLabels": match}
        rules.append({"to": [peer]})
    if settings.internal_cidrs:
        rules.append({"to": [{"ipBlock": {"cidr": cidr}} for cidr in settings.internal_cidrs]})
    broker = _broker_address(settings.broker_url)
    if broker is not None:  # only its port: on a node's address other ports are the node's
        address, port = broker
        rules.append(
            {"to": [{"ipBlock": {"cidr": address}}], "ports": [{"protocol": "TCP", "port": port}]}
        )
    return rules


def _internet(private: tuple[str, ...]) -> list[Manifest]:
    """Everything (IPv4 and IPv6) but the private ranges: the cluster's pods and services,
    its API server, the node and the metadata service are all there."""
    networks = [ipaddress.ip_network(cidr) for cidr in private]
    blocks: list[Manifest] = []
    for everything in (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")):
        excluded = [n for n in networks if n.version == everything.version]
        if any(n.prefixlen == 0 for n in excluded):
            continue  # the whole family is private: no block for it
        block: Manifest = {"cidr": str(everything)}
        if excluded:
            block["except"] = [str(n) for n in excluded]
        blocks.append({"ipBlock": block})
    return blocks


def egress_warning(settings: KubernetesSettings) -> str | None:
    """Why pods of the `egress` profile may not reach the tool-broker, if they may not: a
    broker named by host name (a Service) is reachable only through `broker_pod_labels` or
    `internal_cidrs` (a policy sees the pod's address after the Service's translation)."""
    if not settings.broker_url or _broker_address(settings.broker_url) is not None:
        return None
    if settings.broker_pod_labels or settings.internal_cidrs or settings.egress_cidrs:
        return None
    return (
        f"the tool-broker ({settings.broker_url}) is named by host name and neither "
        "broker_pod_labels nor internal_cidrs lets 'egress' pods reach it: set "
        "SUZUMIO_KUBERNETES__BROKER_POD_LABELS"
    )


def _broker_address(url: str | None) -> tuple[str, int] | None:
    """The broker's address as a /32 (/128) and its port, when `url` names it by IP."""
    if not url:
        return None
    parts = urlsplit(url)
    try:
        address = ipaddress.ip_address(parts.hostname or "")
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None  # a name: the cluster DNS resolves it, the rules above must allow it
    return str(ipaddress.ip_network(address)), port


def redact(manifests: list[Manifest]) -> list[Manifest]:
    """Copies with every Secret value replaced by `***`; the input keeps its shape, with its
    token (and any secret value found in it) replaced."""
    out = copy.deepcopy(manifests)
    for manifest in out:
        if manifest.get("kind") != "Secret":
            continue
        for field in ("stringData", "data"):
            values: dict[str, str] = manifest.get(field) or {}
            hidden = [v for k, v in values.items() if k != INPUT_KEY and v]
            for key, value in values.items():
                values[key] = _redact_input(value, hidden) if key == INPUT_KEY else REDACTED
    return out


def _redact_input(text: str, hidden: list[str]) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        return REDACTED  # base64 `data` from a server: no shape to keep
    if isinstance(data, dict) and "token" in data:
        data["token"] = REDACTED
    redacted = json.dumps(data)
    for value in hidden:
        for form in (value, json.dumps(value)[1:-1]):
            redacted = redacted.replace(form, REDACTED)
    return redacted
