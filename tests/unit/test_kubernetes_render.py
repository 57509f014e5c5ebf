"""The kubernetes backend's manifests, rendered without a cluster: each one is rebuilt strictly
as the kubernetes-asyncio OpenAPI model classes (unknown fields, wrong types and missing
required fields fail), and the security context, resources, owner references, network
policies, names and the place of secrets are what DESIGN.md §8 and §10 ask for."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client import Configuration
from pydantic import ValidationError

from suzumio.contracts.ids import new_id
from suzumio.contracts.runner import (
    ActivationSpec,
    AgentSpec,
    ProjectRef,
    RunnerActivationInput,
    SessionRef,
)
from suzumio.contracts.values import (
    Backend,
    ModelSpec,
    NetworkProfile,
    ResourceLimits,
    RuntimeProfileSpec,
    Timeouts,
)
from suzumio.orchestrator.backends.base import LaunchPlan, MountPlan, labels_for
from suzumio.orchestrator.backends.kubernetes_render import (
    JOB_LABEL,
    PENDING_UID,
    REDACTED,
    KubernetesSettings,
    egress_warning,
    label_value,
    redact,
    render,
    resource_name,
    selector_for,
    with_owner_uid,
)

PROVIDER_KEY = "sk-provider-" + "k" * 24
TOKEN = "szt." + "t" * 40
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SETTINGS = KubernetesSettings(namespace="sandboxes", image="suzumio/runner:test")


def make_plan(
    *,
    network: NetworkProfile = NetworkProfile.EGRESS,
    activation_id: str | None = None,
    attempt: int = 1,
    mounts: tuple[MountPlan, ...] = (),
    image: str | None = None,
    namespace: str = "",
) -> LaunchPlan:
    activation = activation_id or new_id()
    project, agent, session = new_id(), new_id(), new_id()
    runner_input = RunnerActivationInput(
        project=ProjectRef(id=project, name="p"),
        agent=AgentSpec(id=agent, role="r", prompt="p", model=ModelSpec(name="m")),
        session=SessionRef(id=session),
        activation=ActivationSpec(id=activation),
        workspace="/somewhere/else",
        controller_url="http://broker.internal:8094",
        token=TOKEN,
    )
    profile = RuntimeProfileSpec(
        backend=Backend.KUBERNETES,
        image=image,
        entry=("python", "-m", "suzumio.runner", "run"),
        limits=ResourceLimits(cpus=1.5, memory_mb=768, disk_mb=2_048, pids=256),
        network=network,
        timeouts=Timeouts(wall_clock_seconds=900),
    )
    plan = LaunchPlan(
        activation_id=activation,
        session_id=session,
        project_id=project,
        agent_id=agent,
        attempt=attempt,
        input=runner_input,
        profile=profile,
        env={
            "SUZUMIO_ACTIVATION_ID": activation,
            "SUZUMIO_MODEL_BASE_URL": "http://models.internal/v1",
            "SUZUMIO_MODEL_API_KEY": PROVIDER_KEY,
        },
        secret_keys=frozenset({"SUZUMIO_MODEL_API_KEY"}),
        host_dir=Path("/var/lib/suzumio/activations") / activation,
        session_dir=Path("/var/lib/suzumio/sessions") / session,
        mounts=mounts,
    )
    return LaunchPlan(**{**plan.__dict__, "labels": labels_for(plan, namespace)})


# -- strict OpenAPI validation ----------------------------------------------------------------

STRICT = Configuration()
STRICT.client_side_validation = True
PRIMITIVES: dict[str, Any] = {"str": str, "bool": bool, "float": (int, float), "object": object}


def strict(type_name: str, value: Any, path: str = "$") -> Any:
    """`value` rebuilt as the model `type_name` names, refusing anything the schema lacks."""
    if type_name.startswith("list["):
        assert isinstance(value, list), f"{path}: expected a list, got {value!r}"
        return [strict(type_name[5:-1], v, f"{path}[{i}]") for i, v in enumerate(value)]
    if type_name.startswith("dict("):
        assert isinstance(value, dict), f"{path}: expected a map, got {value!r}"
        inner = type_name[type_name.index(",") + 1 : -1].strip()
        return {k: strict(inner, v, f"{path}.{k}") for k, v in value.items()}
    if type_name == "int":
        assert type(value) is int, f"{path}: expected an integer, got {value!r}"
        return value
    if type_name in PRIMITIVES:
        assert isinstance(value, PRIMITIVES[type_name]), f"{path}: not a {type_name}: {value!r}"
        return value
    model = getattr(client, type_name)
    assert isinstance(value, dict), f"{path}: expected a {type_name} object, got {value!r}"
    attributes = {key: attr for attr, key in model.attribute_map.items()}
    unknown = set(value) - set(attributes)
    assert not unknown, f"{path}: {type_name} has no field {sorted(unknown)}"
    kwargs = {
        attributes[k]: strict(model.openapi_types[attributes[k]], v, f"{path}.{k}")
        for k, v in value.items()
    }
    return model(**kwargs, local_vars_configuration=STRICT)


def to_json(value: Any) -> Any:
    if isinstance(value, list):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if hasattr(value, "attribute_map"):
        pairs = ((key, getattr(value, attr)) for attr, key in value.attribute_map.items())
        return {key: to_json(v) for key, v in pairs if v is not None}
    return value


MODELS = {
    "Job": "V1Job",
    "Secret": "V1Secret",
    "ConfigMap": "V1ConfigMap",
    "NetworkPolicy": "V1NetworkPolicy",
}


def by_kind(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {m["kind"]: m for m in manifests}


@pytest.mark.parametrize("network", list(NetworkProfile))
def test_every_manifest_is_a_valid_kubernetes_object(network: NetworkProfile) -> None:
    manifests = render(make_plan(network=network), SETTINGS)
    assert [m["kind"] for m in manifests] == ["Job", "Secret", "ConfigMap", "NetworkPolicy"]
    for manifest in manifests:
        built = strict(MODELS[manifest["kind"]], manifest)
        assert to_json(built) == manifest  # nothing was dropped on the way


def test_the_strict_check_rejects_what_the_schema_does_not_have() -> None:
    job = render(make_plan(), SETTINGS)[0]
    with pytest.raises(AssertionError, match="no field"):
        strict("V1Job", {**job, "spec": {**job["spec"], "backoffLimitt": 0}})
    container = job["spec"]["template"]["spec"]["containers"][0]
    with pytest.raises(ValueError, match="name"):
        strict("V1Container", {k: v for k, v in container.items() if k != "name"})
    with pytest.raises(AssertionError, match="integer"):
        strict("V1JobSpec", {**job["spec"], "backoffLimit": "0"})


# -- the Job ----------------------------------------------------------------------------------


def test_the_job_runs_once_suspended_with_deadline_and_ttl() -> None:
    plan = make_plan()
    job = render(plan, SETTINGS)[0]
    assert job["metadata"]["namespace"] == "sandboxes"
    spec = job["spec"]
    assert spec["backoffLimit"] == 0
    assert spec["suspend"] is True  # resumed by launch once its dependents exist
    assert spec["activeDeadlineSeconds"] == 900
    assert spec["ttlSecondsAfterFinished"] == SETTINGS.ttl_seconds_after_finished
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False
    assert "serviceAccountName" not in pod
    no_ttl = KubernetesSettings(image="i", ttl_seconds_after_finished=None)
    assert "ttlSecondsAfterFinished" not in render(plan, no_ttl)[0]["spec"]


def test_the_pod_security_context_follows_the_seeds() -> None:
    settings = KubernetesSettings(image="i", run_as_user=1000, run_as_group=1001, fs_group=1002)
    pod = render(make_plan(), settings)[0]["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1001,
        "fsGroup": 1002,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    [container] = pod["containers"]
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    default = render(make_plan(), SETTINGS)[0]["spec"]["template"]["spec"]["securityContext"]
    assert (default["runAsUser"], default["runAsGroup"], default["fsGroup"]) == (65534,) * 3


def test_resources_come_from_the_profile_limits() -> None:
    job = render(make_plan(), SETTINGS)[0]
    [container] = job["spec"]["template"]["spec"]["containers"]
    expected = {"cpu": "1500m", "memory": "768Mi", "ephemeral-storage": "2048Mi"}
    assert container["resources"] == {"requests": expected, "limits": expected}
    assert container["command"] == ["python", "-m", "suzumio.runner", "run"]
    assert container["image"] == "suzumio/runner:test"
    assert (
        render(make_plan(image="own:1"), SETTINGS)[0]["spec"]["template"]["spec"]["containers"][0][
            "image"
        ]
        == "own:1"
    )


def test_volumes_input_read_only_workspace_and_tmp_as_sized_empty_dirs() -> None:
    name = resource_name("a", 1)
    pod = render(make_plan(activation_id="a"), SETTINGS)[0]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert volumes["activation"]["secret"]["secretName"] == name
    assert volumes["activation"]["secret"]["items"] == [{"key": "input.json", "path": "input.json"}]
    assert mounts["/activation"] == {
        "name": "activation",
        "mountPath": "/activation",
        "readOnly": True,
    }
    assert volumes["workspace"] == {"name": "workspace", "emptyDir": {"sizeLimit": "2048Mi"}}
    assert mounts["/workspace"]["name"] == "workspace"
    assert volumes["tmp"]["emptyDir"] == {"sizeLimit": "256Mi"}
    assert mounts["/tmp"]["name"] == "tmp"
    assert set(volumes) == {"activation", "workspace", "tmp"}


def test_host_paths_only_where_allowed() -> None:
    grant = MountPlan(host_path=Path("/srv/data"), target="/data", writable=False)
    with pytest.raises(ValueError, match="host_paths"):
        render(make_plan(mounts=(grant,)), SETTINGS)
    settings = KubernetesSettings(image="i", host_paths=True)
    plan = make_plan(mounts=(grant,))
    pod = render(plan, settings)[0]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["workspace"]["hostPath"]["path"] == str(plan.host_dir / "workspace")
    assert volumes["session"]["hostPath"]["path"] == str(plan.session_dir)
    assert volumes["mount-0"]["hostPath"] == {"path": "/srv/data", "type": "Directory"}
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["/data"]["readOnly"] is True
    assert mounts["/workspace/session"]["name"] == "session"


def test_a_plan_without_an_image_or_with_a_bad_env_name_is_refused() -> None:
    with pytest.raises(ValueError, match="image"):
        render(make_plan(), KubernetesSettings())
    plan = make_plan()
    bad = LaunchPlan(**{**plan.__dict__, "env": {**plan.env, "NOT-AN-ENV": "x"}})
    with pytest.raises(ValueError, match="environment variable"):
        render(bad, SETTINGS)
    huge = LaunchPlan(
        **{**plan.__dict__, "env": {**plan.env, "SUZUMIO_MODEL_API_KEY": "k" * 2**20}}
    )
    with pytest.raises(ValueError, match="too large for a Secret"):
        render(huge, SETTINGS)


# -- secrets ----------------------------------------------------------------------------------


def test_token_and_keys_are_in_the_secret_and_nowhere_else() -> None:
    plan = make_plan()
    manifests = by_kind(render(plan, SETTINGS))
    secret = manifests["Secret"]
    assert secret["type"] == "Opaque"
    assert secret["stringData"]["SUZUMIO_MODEL_API_KEY"] == PROVIDER_KEY
    runner_input = json.loads(secret["stringData"]["input.json"])
    assert runner_input["token"] == TOKEN
    assert runner_input["workspace"] == "/workspace"
    for kind in ("Job", "ConfigMap", "NetworkPolicy"):
        text = json.dumps(manifests[kind])
        assert PROVIDER_KEY not in text
        assert TOKEN not in text
    config_map = manifests["ConfigMap"]["data"]
    assert config_map["SUZUMIO_MODEL_BASE_URL"] == "http://models.internal/v1"
    assert "SUZUMIO_MODEL_API_KEY" not in config_map
    [container] = manifests["Job"]["spec"]["template"]["spec"]["containers"]
    name = manifests["Job"]["metadata"]["name"]
    assert container["envFrom"] == [{"configMapRef": {"name": name}}]
    ref = {"secretKeyRef": {"name": name, "key": "SUZUMIO_MODEL_API_KEY"}}
    assert container["env"] == [{"name": "SUZUMIO_MODEL_API_KEY", "valueFrom": ref}]


def test_the_broker_url_as_pods_see_it_replaces_the_controller_url() -> None:
    settings = KubernetesSettings(image="i", broker_url="http://toolbroker.suzumio:8094")
    secret = render(make_plan(), settings)[1]
    assert json.loads(secret["stringData"]["input.json"])["controller_url"] == (
        "http://toolbroker.suzumio:8094"
    )


def test_redaction_hides_every_secret_value_and_keeps_the_input_readable() -> None:
    manifests = render(make_plan(), SETTINGS)
    redacted = redact(manifests)
    text = json.dumps(redacted)
    assert PROVIDER_KEY not in text
    assert TOKEN not in text
    secret = by_kind(redacted)["Secret"]
    assert secret["stringData"]["SUZUMIO_MODEL_API_KEY"] == REDACTED
    assert json.loads(secret["stringData"]["input.json"])["token"] == REDACTED
    assert by_kind(manifests)["Secret"]["stringData"]["SUZUMIO_MODEL_API_KEY"] == PROVIDER_KEY
    assert strict("V1Secret", secret)


# -- owner references, labels, names ----------------------------------------------------------


def test_dependents_are_owned_by_the_job() -> None:
    job, *dependents = render(make_plan(), SETTINGS, job_uid="uid-1")
    assert "ownerReferences" not in job["metadata"]
    for manifest in dependents:
        assert manifest["metadata"]["name"] == job["metadata"]["name"]
        assert manifest["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": job["metadata"]["name"],
                "uid": "uid-1",
                "controller": True,
            }
        ]
    pending = render(make_plan(), SETTINGS)[1]
    assert pending["metadata"]["ownerReferences"][0]["uid"] == PENDING_UID
    owned = with_owner_uid(pending, "uid-2")
    assert owned["metadata"]["ownerReferences"][0]["uid"] == "uid-2"
    assert pending["metadata"]["ownerReferences"][0]["uid"] == PENDING_UID


def test_labels_are_valid_and_select_the_platform_namespace() -> None:
    plan = make_plan(namespace="test-ns")
    for manifest in render(plan, SETTINGS, namespace="test-ns"):
        labels = manifest["metadata"]["labels"]
        assert labels["suzumio.io/managed"] == "true"
        assert labels["suzumio.io/namespace"] == "test-ns"
        assert labels["suzumio.io/activation"] == plan.activation_id
        assert labels["suzumio.io/attempt"] == "1"
        assert labels[JOB_LABEL] == manifest["metadata"]["name"]
        annotations = manifest["metadata"]["annotations"]
        assert annotations["suzumio.io/activation"] == plan.activation_id
        assert "suzumio.io/labels" not in annotations  # the plan's labels are the standard ones
    assert selector_for("test-ns") == "suzumio.io/managed=true,suzumio.io/namespace=test-ns"
    empty = selector_for("").split("=")[-1]
    assert empty == label_value("-")
    assert re.fullmatch(r"[a-z0-9]{10}", empty)


@pytest.mark.parametrize(
    "value",
    ["-", "", "a" * 64, "Mixed_Case.ok", "with spaces/and:colons", "-leading", "x" * 200],
)
def test_label_values_are_always_valid(value: str) -> None:
    result = label_value(value)
    assert len(result) <= 63
    assert re.fullmatch(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", result)


@pytest.mark.parametrize(
    "activation_id",
    [new_id(), "A" * 64, "under_score-and-CAPS", "-x-", "0" * 64, "abc"],
    ids=["new-id", "64-capitals", "underscore-and-caps", "dashes", "64-zeros", "short"],
)
def test_names_are_dns_1123_labels(activation_id: str) -> None:
    for attempt in (1, 12, 999):
        name = resource_name(activation_id, attempt)
        assert len(name) <= 63
        assert DNS_LABEL.fullmatch(name), name
        assert name.endswith(f"-{attempt}")


def test_names_of_uuids_keep_the_whole_id_and_never_collide() -> None:
    first = new_id()
    second = first[:-1] + ("1" if first[-1] == "0" else "0")  # minted in the same minute
    assert resource_name(first, 1) == f"sz-{first}-1"
    assert resource_name(first, 1) != resource_name(second, 1)
    assert resource_name("ABC", 1) != resource_name("abc", 1)


# -- network policies -------------------------------------------------------------------------


def policy(network: NetworkProfile, settings: KubernetesSettings = SETTINGS) -> dict[str, Any]:
    return by_kind(render(make_plan(network=network), settings))["NetworkPolicy"]


def test_network_none_denies_everything() -> None:
    spec = policy(NetworkProfile.NONE)["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in spec
    assert "egress" not in spec
    assert list(spec["podSelector"]["matchLabels"]) == [JOB_LABEL]


CLUSTER_DNS = {
    "to": [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        },
        {"ipBlock": {"cidr": "169.254.20.10/32"}},  # NodeLocal DNSCache, where it runs
    ],
    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
}


def test_network_egress_without_cidrs_allows_the_internet_but_no_private_range() -> None:
    """Not `egress: [{}]`: that reached the cluster's services, its API server and the cloud
    metadata service; DNS goes only to the cluster DNS (port 53 anywhere is a tunnel)."""
    manifest = policy(NetworkProfile.EGRESS)
    spec = manifest["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in spec
    dns, internet = spec["egress"]
    assert dns == CLUSTER_DNS
    assert "ports" not in internet
    assert internet["to"] == [
        {
            "ipBlock": {
                "cidr": "0.0.0.0/0",
                "except": [
                    "10.0.0.0/8",
                    "172.16.0.0/12",
                    "192.168.0.0/16",
                    "169.254.0.0/16",
                    "100.64.0.0/10",
                    "127.0.0.0/8",
                ],
            }
        },
        {"ipBlock": {"cidr": "::/0", "except": ["fc00::/7", "fe80::/10", "::1/128"]}},
    ]
    assert all(rule.get("to") for rule in spec["egress"])  # no rule open to anywhere
    strict("V1NetworkPolicy", manifest)


def test_network_egress_where_the_pods_may_go() -> None:
    """The broker by address (its port only), private ranges let through on purpose, the
    cluster DNS where the settings say, and what counts as private."""
    settings = KubernetesSettings(
        image="i",
        broker_url="http://192.168.1.20:8421",
        internal_cidrs=("10.20.0.0/16",),
        dns_namespace="dns",
        dns_pod_labels={"app": "coredns"},
        dns_cidrs=(),
        private_cidrs=("10.0.0.0/8",),
    )
    manifest = policy(NetworkProfile.EGRESS, settings)
    dns, internet, internal, broker = manifest["spec"]["egress"]
    assert dns["to"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "dns"}},
            "podSelector": {"matchLabels": {"app": "coredns"}},
        }
    ]
    assert internet["to"] == [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}},
        {"ipBlock": {"cidr": "::/0"}},
    ]
    assert internal == {"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}]}
    assert broker == {
        "to": [{"ipBlock": {"cidr": "192.168.1.20/32"}}],
        "ports": [{"protocol": "TCP", "port": 8421}],
    }
    strict("V1NetworkPolicy", manifest)
    named = KubernetesSettings(image="i", broker_url="http://broker.suzumio:8421")
    assert len(policy(NetworkProfile.EGRESS, named)["spec"]["egress"]) == 2


def test_network_egress_with_cidrs_allows_cluster_dns_broker_and_those_cidrs() -> None:
    settings = KubernetesSettings(
        image="i",
        egress_cidrs=("10.0.0.7/32", "203.0.113.0/24"),
        broker_pod_labels={"app": "suzumio-toolbroker"},
        broker_namespace="suzumio",
    )
    spec = policy(NetworkProfile.EGRESS, settings)["spec"]
    dns, cidrs, broker = spec["egress"]
    assert dns == CLUSTER_DNS  # not port 53 to anywhere
    assert cidrs == {
        "to": [{"ipBlock": {"cidr": "10.0.0.7/32"}}, {"ipBlock": {"cidr": "203.0.113.0/24"}}]
    }
    assert broker == {
        "to": [
            {
                "podSelector": {"matchLabels": {"app": "suzumio-toolbroker"}},
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "suzumio"}},
            }
        ]
    }
    assert "ingress" not in spec
    strict("V1NetworkPolicy", policy(NetworkProfile.EGRESS, settings))


def test_network_full_allows_everything() -> None:
    spec = policy(NetworkProfile.FULL)["spec"]
    assert spec["ingress"] == [{}]
    assert spec["egress"] == [{}]


def test_settings_refuse_bad_cidrs_and_namespaces() -> None:
    with pytest.raises(ValidationError):
        KubernetesSettings(egress_cidrs=("not-a-cidr",))
    with pytest.raises(ValidationError):
        KubernetesSettings(namespace="Not_Valid")
    assert KubernetesSettings(egress_cidrs=("10.0.0.7/24",)).egress_cidrs == ("10.0.0.0/24",)


def test_a_broker_named_by_host_name_that_egress_cannot_reach_is_warned_about() -> None:
    named = KubernetesSettings(image="i", broker_url="http://suzumio-toolbroker.ns.svc:8081")
    assert "broker_pod_labels" in (egress_warning(named) or "")
    labelled = named.model_copy(update={"broker_pod_labels": {"app": "toolbroker"}})
    assert egress_warning(labelled) is None
    by_ip = KubernetesSettings(image="i", broker_url="http://10.0.0.5:8081")
    assert egress_warning(by_ip) is None  # its address is let through
