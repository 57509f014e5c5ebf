"""`deploy/k8s/` checked without a cluster (docs/kubernetes-deploy.md): every manifest rebuilt
strictly as the kubernetes-asyncio OpenAPI models, KEDA's ScaledObject and the kustomizations
against schemas of their known fields, and the cross-references that break a deployment
silently — settings names and values, Secrets and ConfigMaps, selectors, NATS's cluster size,
network policies, and the orchestrator's Role, compared with the calls the kubernetes backend
makes against the FAKE Kubernetes API server (`suzumio.testing.fake_kubernetes`; DESIGN.md §13).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml
from kubernetes_asyncio import client
from pydantic import AliasChoices, BaseModel
from pydantic_settings import BaseSettings

from suzumio.contracts.subjects import Topology
from suzumio.gateway.settings import GatewaySettings
from suzumio.orchestrator.backends import kubernetes as kubernetes_backend
from suzumio.orchestrator.backends.kubernetes import KubernetesBackend
from suzumio.orchestrator.backends.kubernetes_render import (
    KubernetesSettings,
    egress_warning,
    render,
)
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.platform.service.health import Readiness
from suzumio.runner import __main__ as runner_main
from suzumio.runner import health
from suzumio.scheduler.settings import SchedulerSettings
from suzumio.session.settings import SessionSettings
from suzumio.testing.fake_kubernetes import FakeKubernetesServer
from suzumio.toolbroker.settings import ToolbrokerSettings
from tests.unit.test_kubernetes_render import make_plan, strict, to_json

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
DOC = ROOT / "docs" / "kubernetes-deploy.md"
Manifest = dict[str, Any]


def load(path: Path) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


KUSTOMIZATION = load(K8S / "kustomization.yaml")[0]
KEDA_COMPONENT = load(K8S / "keda" / "kustomization.yaml")[0]
BASE = [doc for name in KUSTOMIZATION["resources"] for doc in load(K8S / name)]
KEDA = [doc for name in KEDA_COMPONENT["resources"] for doc in load(K8S / "keda" / name)]
EXAMPLE_SECRETS = load(K8S / "secrets.example.yaml")
SETTINGS: dict[str, type[BaseSettings]] = {
    "suzumio.session": SessionSettings,
    "suzumio.scheduler": SchedulerSettings,
    "suzumio.orchestrator": OrchestratorSettings,
    "suzumio.toolbroker": ToolbrokerSettings,
    "suzumio.gateway": GatewaySettings,
}
MODELS = {
    "Namespace": "V1Namespace",
    "ConfigMap": "V1ConfigMap",
    "Secret": "V1Secret",
    "Service": "V1Service",
    "ServiceAccount": "V1ServiceAccount",
    "StatefulSet": "V1StatefulSet",
    "Deployment": "V1Deployment",
    "PodDisruptionBudget": "V1PodDisruptionBudget",
    "HorizontalPodAutoscaler": "V2HorizontalPodAutoscaler",
    "Role": "V1Role",
    "RoleBinding": "V1RoleBinding",
    "NetworkPolicy": "V1NetworkPolicy",
}
API_VERSIONS = {
    "StatefulSet": "apps/v1",
    "Deployment": "apps/v1",
    "PodDisruptionBudget": "policy/v1",
    "HorizontalPodAutoscaler": "autoscaling/v2",
    "Role": "rbac.authorization.k8s.io/v1",
    "RoleBinding": "rbac.authorization.k8s.io/v1",
    "NetworkPolicy": "networking.k8s.io/v1",
}


def objects(kind: str, docs: list[Manifest] = BASE) -> list[Manifest]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(kind: str, name: str, docs: list[Manifest] = BASE) -> Manifest:
    [found] = [doc for doc in objects(kind, docs) if doc["metadata"]["name"] == name]
    return found


def workloads() -> list[Manifest]:
    return objects("Deployment") + objects("StatefulSet")


def pod(workload: Manifest) -> Manifest:
    spec: Manifest = workload["spec"]["template"]["spec"]
    return spec


def env_of(container: Manifest) -> dict[str, Manifest]:
    """Every variable the container gets: its `env` and the keys of its `envFrom` ConfigMaps."""
    found: dict[str, Manifest] = {}
    for source in container.get("envFrom", []):
        config = one("ConfigMap", source["configMapRef"]["name"])
        found |= {key: {"name": key, "value": value} for key, value in config["data"].items()}
    return found | {entry["name"]: entry for entry in container.get("env", [])}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


# -- the files and their schemas --------------------------------------------------------------


def test_the_kustomization_lists_every_manifest_and_only_those() -> None:
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(KUSTOMIZATION["resources"]) == files - {"secrets.example.yaml"}
    assert {p.name for p in (K8S / "keda").glob("*.yaml")} == {
        "kustomization.yaml",
        *KEDA_COMPONENT["resources"],
    }
    assert not list(K8S.glob("*.yml"))
    assert not list(K8S.glob("**/*.json"))
    images = {entry["name"] for entry in KUSTOMIZATION["images"]}
    used = {c["image"].split(":")[0] for w in workloads() for c in pod(w)["containers"]}
    assert images <= used  # a kustomize `images` entry that names no image does nothing


KUSTOMIZE_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "resources"],
    "properties": {
        "apiVersion": {"enum": ["kustomize.config.k8s.io/v1beta1"]},
        "kind": {"const": "Kustomization"},
        "resources": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "images": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name"],
                "properties": {k: {"type": "string"} for k in ("name", "newName", "newTag")},
            },
        },
    },
}
COMPONENT_SCHEMA = {
    **KUSTOMIZE_SCHEMA,
    "properties": {
        "apiVersion": {"const": "kustomize.config.k8s.io/v1alpha1"},
        "kind": {"const": "Component"},
        "resources": KUSTOMIZE_SCHEMA["properties"]["resources"],  # type: ignore[index]
        "patches": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["patch", "target"],
                "properties": {"patch": {"type": "string"}, "target": {"type": "object"}},
            },
        },
    },
}


def test_the_kustomizations_have_only_fields_kustomize_knows() -> None:
    jsonschema.validate(KUSTOMIZATION, KUSTOMIZE_SCHEMA)
    jsonschema.validate(KEDA_COMPONENT, COMPONENT_SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**KUSTOMIZATION, "resource": []}, KUSTOMIZE_SCHEMA)


def all_manifests() -> Iterator[Any]:
    for doc in [*BASE, *EXAMPLE_SECRETS, *objects("NetworkPolicy", KEDA)]:
        yield pytest.param(doc, id=f"{doc['kind']}/{doc['metadata']['name']}")


@pytest.mark.parametrize("manifest", list(all_manifests()))
def test_every_manifest_is_a_valid_kubernetes_object(manifest: Manifest) -> None:
    assert manifest["apiVersion"] == API_VERSIONS.get(manifest["kind"], "v1")
    built = strict(MODELS[manifest["kind"]], manifest)
    assert to_json(built) == manifest  # nothing was dropped on the way
    if manifest["kind"] != "Namespace":
        assert manifest["metadata"]["namespace"] in {
            ns["metadata"]["name"] for ns in objects("Namespace")
        }


def test_the_strict_check_catches_a_misspelled_field() -> None:
    deployment = one("Deployment", "gateway")
    template = deployment["spec"]["template"]
    broken = {**template, "spec": {**pod(deployment), "serviceAcountName": "x"}}
    with pytest.raises(AssertionError, match="serviceAcountName"):
        strict("V1Deployment", {**deployment, "spec": {**deployment["spec"], "template": broken}})


# KEDA's CRD is not in the OpenAPI models: the fields of keda.sh/v1alpha1 ScaledObject it uses.
SCALED_OBJECT_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "namespace"],
            "properties": {
                "name": {"type": "string"},
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name"],
                    "properties": {k: {"type": "string"} for k in ("name", "kind", "apiVersion")},
                },
                **{
                    k: {"type": "integer", "minimum": 0}
                    for k in (
                        "minReplicaCount",
                        "maxReplicaCount",
                        "pollingInterval",
                        "cooldownPeriod",
                    )
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"const": "nats-jetstream"},
                            # map[string]string in KEDA: a YAML number here is refused.
                            "metadata": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["natsServerMonitoringEndpoint", "stream", "consumer"],
                                "properties": {
                                    k: {"type": "string"}
                                    for k in (
                                        "natsServerMonitoringEndpoint",
                                        "account",
                                        "stream",
                                        "consumer",
                                        "lagThreshold",
                                        "activationLagThreshold",
                                        "useHttps",
                                    )
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def test_the_keda_scaled_object_watches_the_pool_consumer_of_the_workers() -> None:
    [scaled] = objects("ScaledObject", KEDA)
    jsonschema.validate(scaled, SCALED_OBJECT_SCHEMA)
    worker = one("Deployment", scaled["spec"]["scaleTargetRef"]["name"])
    assert scaled["metadata"]["namespace"] == worker["metadata"]["namespace"]
    args = worker_args(worker)
    namespace = env_of(pod(worker)["containers"][0]).get("SUZUMIO_NAMESPACE", {}).get("value", "")
    topology = Topology(namespace=namespace)
    [trigger] = scaled["spec"]["triggers"]
    metadata = trigger["metadata"]
    assert metadata["stream"] == topology.activations_stream
    assert metadata["consumer"] == topology.pool_consumer(args.pool)
    # On a cluster KEDA asks the consumer's leader as <server name>.<endpoint>: the headless
    # Service under which each node (server_name = pod name) has a DNS name.
    nats = one("StatefulSet", "nats")
    host, port = metadata["natsServerMonitoringEndpoint"].rsplit(":", 1)
    assert (
        host == f"{nats['spec']['serviceName']}.{nats['metadata']['namespace']}.svc.cluster.local"
    )
    assert int(port) in container_ports(nats).values()
    assert "server_name: $POD_NAME" in nats_conf()
    # The component's patch deletes the CPU autoscaler of the same Deployment.
    [patch] = KEDA_COMPONENT["patches"]
    deleted = yaml.safe_load(patch["patch"])
    assert deleted["$patch"] == "delete"
    hpa = one("HorizontalPodAutoscaler", deleted["metadata"]["name"])
    assert hpa["spec"]["scaleTargetRef"]["name"] == worker["metadata"]["name"]
    assert patch["target"]["kind"] == "HorizontalPodAutoscaler"


# -- workloads ---------------------------------------------------------------------------------


def container_ports(workload: Manifest) -> dict[str, int]:
    return {
        port["name"]: port["containerPort"]
        for container in pod(workload)["containers"]
        for port in container.get("ports", [])
    }


def service_deployments() -> list[tuple[Manifest, type[BaseSettings]]]:
    found = []
    for deployment in objects("Deployment"):
        container = pod(deployment)["containers"][0]
        if container["image"].startswith("suzumio/services"):
            found.append((deployment, SETTINGS[container["args"][0]]))
    return found


def test_the_five_services_run_as_in_compose_with_replicas_and_probes() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    found = service_deployments()
    assert sorted(d["metadata"]["name"] for d, _ in found) == sorted(
        ["session", "scheduler", "orchestrator", "toolbroker", "gateway"]
    )
    routes = {route.path for route in Readiness("s", None, None, Topology()).routes()}  # type: ignore[arg-type]
    for deployment, _ in found:
        name = deployment["metadata"]["name"]
        [container] = pod(deployment)["containers"]
        assert container["args"] == compose[name]["command"]
        assert deployment["spec"]["replicas"] >= 2
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            get = container[probe]["httpGet"]
            assert get["path"] in routes
            assert get["port"] in container_ports(deployment)
        assert selects(deployment["spec"]["selector"]["matchLabels"], template_labels(deployment))
        [budget] = [b for b in objects("PodDisruptionBudget") if selects_workload(b, deployment)]
        assert budget["spec"]["maxUnavailable"] == 1


def template_labels(workload: Manifest) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def selects_workload(selecting: Manifest, workload: Manifest) -> bool:
    """Whether a Service (`spec.selector`) or a budget (`spec.selector.matchLabels`) picks
    the workload's pods; an empty selector picks nothing here (it is never meant)."""
    selector = selecting["spec"]["selector"]
    selector = selector if selecting["kind"] == "Service" else selector["matchLabels"]
    same_namespace = selecting["metadata"]["namespace"] == workload["metadata"]["namespace"]
    return same_namespace and bool(selector) and selects(selector, template_labels(workload))


def test_every_pod_is_locked_down_and_sized() -> None:
    for workload in workloads():
        spec = pod(workload)
        context = spec["securityContext"]
        assert context["runAsNonRoot"] is True
        assert context["runAsUser"] > 0
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}
        orchestrator = spec.get("serviceAccountName") == "suzumio-orchestrator"
        assert spec["automountServiceAccountToken"] is orchestrator
        mounts_needed = {v["name"] for v in spec.get("volumes", [])} | {
            t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])
        }
        for container in spec["containers"]:
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False
            assert security["readOnlyRootFilesystem"] is True
            assert security["capabilities"] == {"drop": ["ALL"]}
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][kind])
            assert {m["name"] for m in container.get("volumeMounts", [])} <= mounts_needed


def test_the_services_have_their_data_directory_and_tmp_writable() -> None:
    """The root filesystem is read-only: the image's SUZUMIO_DATA_DIR (the orchestrator's
    sandboxes directory, bootstrap-admin's key) and /tmp (uploads) must be volumes."""
    dockerfile = (ROOT / "deploy" / "services" / "Dockerfile").read_text()
    data_dir = re.search(r"^ENV SUZUMIO_DATA_DIR=(\S+)$", dockerfile, re.MULTILINE)
    assert data_dir is not None
    for deployment, _ in service_deployments():
        [container] = pod(deployment)["containers"]
        mounted = {m["mountPath"] for m in container["volumeMounts"]}
        assert {data_dir[1], "/tmp"} <= mounted  # noqa: S108 - the pod's own emptyDir


RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def restricted_violations(spec: Manifest) -> list[str]:
    """What Pod Security "restricted" (both namespaces enforce it) would refuse in a pod."""
    context = spec.get("securityContext", {})
    found = [f"host {k}" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    found += [
        f"volume {v['name']}"
        for v in spec.get("volumes", [])
        if not set(v) - {"name"} <= RESTRICTED_VOLUMES
    ]
    for container in spec["containers"] + spec.get("initContainers", []):
        own = container.get("securityContext", {})
        if own.get("privileged") or own.get("allowPrivilegeEscalation") is not False:
            found.append(f"{container['name']}: privilege escalation")
        if not (own.get("runAsNonRoot") or context.get("runAsNonRoot")):
            found.append(f"{container['name']}: may run as root")
        if 0 in (own.get("runAsUser"), context.get("runAsUser")):
            found.append(f"{container['name']}: runs as root")
        seccomp = own.get("seccompProfile") or context.get("seccompProfile") or {}
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            found.append(f"{container['name']}: seccomp")
        capabilities = own.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []) or set(capabilities.get("add", [])) - {
            "NET_BIND_SERVICE"
        }:
            found.append(f"{container['name']}: capabilities")
        if any("hostPort" in port for port in container.get("ports", [])):
            found.append(f"{container['name']}: host port")
    return found


def test_every_pod_passes_the_restricted_pod_security_its_namespace_enforces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for namespace in objects("Namespace"):
        assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for workload in workloads():
        assert restricted_violations(pod(workload)) == [], workload["metadata"]["name"]
    # The Jobs the kubernetes backend renders with the orchestrator's settings, too: the
    # admission would refuse their pods, and each activation would fail as `NoPod`.
    kube = settings_of(one("Deployment", "orchestrator"), monkeypatch).kubernetes
    job = render(make_plan(), kube)[0]
    assert restricted_violations(job["spec"]["template"]["spec"]) == []
    broken = {**pod(one("Deployment", "gateway")), "hostNetwork": True}
    assert restricted_violations(broken) == ["host hostNetwork"]


# -- settings ----------------------------------------------------------------------------------


def setting_names(settings: type[BaseSettings]) -> set[str]:
    """Every environment variable `settings` reads: prefix + field, a field's aliases, and
    prefix + field + delimiter + subfield for nested models."""
    prefix = str(settings.model_config.get("env_prefix") or "")
    delimiter = settings.model_config.get("env_nested_delimiter")
    names: set[str] = set()
    for name, field in settings.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            names |= {choice for choice in alias.choices if isinstance(choice, str)}
        else:
            names.add(alias if isinstance(alias, str) else prefix + name)
        nested = field.annotation
        if delimiter and isinstance(nested, type) and issubclass(nested, BaseModel):
            names |= {f"{prefix}{name}{delimiter}{sub}" for sub in nested.model_fields}
    return {n.upper() for n in names}


def test_setting_names_come_from_the_settings_classes() -> None:
    names = setting_names(OrchestratorSettings)
    assert {"SUZUMIO_REPLICAS", "SUZUMIO_KUBERNETES__NAMESPACE", "OPENAI_API_KEY"} <= names
    assert "SUZUMIO_MODEL_API_KEY" in names
    assert "SUZUMIO_KUBERNETES__NAMESPAC" not in names
    assert "SUZUMIO_MAX_BATCH" in setting_names(SchedulerSettings) - names


def test_every_variable_a_service_gets_is_one_of_its_settings() -> None:
    for deployment, settings in service_deployments():
        [container] = pod(deployment)["containers"]
        unknown = set(env_of(container)) - setting_names(settings)
        assert not unknown, f"{deployment['metadata']['name']}: not settings: {sorted(unknown)}"


# Stand-ins for the Secrets' values, of the shape the commands in the docs create.
SECRET_VALUES = {
    ("suzumio-nats", "url"): "nats://t0ken@nats.suzumio.svc.cluster.local:4222",
    (
        "suzumio-postgres",
        "url",
    ): "postgresql://suzumio:pw@postgres.suzumio.svc.cluster.local:5432/suzumio",
    ("suzumio-secret-key", "secret-key"): "A" * 43 + "=",
    ("suzumio-model", "base-url"): "https://models.example/v1",
    ("suzumio-model", "api-key"): "sk-" + "k" * 32,
}


def resolved(container: Manifest) -> dict[str, str]:
    values = {}
    for name, entry in env_of(container).items():
        if "value" in entry:
            values[name] = entry["value"]
        elif "secretKeyRef" in entry.get("valueFrom", {}):
            ref = entry["valueFrom"]["secretKeyRef"]
            values[name] = SECRET_VALUES[(ref["name"], ref["key"])]
        else:
            values[name] = "pod-name"  # fieldRef metadata.name
    return values


def settings_of(deployment: Manifest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The deployment's settings as its service reads them from that environment alone."""
    [container] = pod(deployment)["containers"]
    settings = SETTINGS[container["args"][0]]
    with monkeypatch.context() as env:
        for name in os.environ:
            if name.startswith(("SUZUMIO_", "OPENAI_")):
                env.delenv(name)
        for name, value in resolved(container).items():
            env.setenv(name, value)
        return settings()  # a value it refuses exits 2 with the variable's name


def test_every_value_parses_as_its_service_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    nats = one("StatefulSet", "nats")
    for deployment, _ in service_deployments():
        settings = settings_of(deployment, monkeypatch)
        assert settings.replicas == nats["spec"]["replicas"] == 3
        assert settings.http_host == "0.0.0.0"  # noqa: S104 - probes come from the node
        assert settings.http_port == container_ports(deployment)["http"]
        assert settings.nats_url is not None
        assert settings.database_url is not None
        assert settings.secret_key is not None


def test_the_orchestrator_runs_jobs_where_its_role_is_and_reaches_the_broker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    orchestrator = settings_of(one("Deployment", "orchestrator"), monkeypatch)
    scheduler = settings_of(one("Deployment", "scheduler"), monkeypatch)
    assert orchestrator.default_backend == scheduler.default_backend
    assert orchestrator.default_backend in orchestrator.backends
    kube = orchestrator.kubernetes
    assert kube.in_cluster
    assert kube.api_url is None
    role = one("Role", "suzumio-orchestrator")
    binding = one("RoleBinding", "suzumio-orchestrator")
    assert kube.namespace == role["metadata"]["namespace"] == binding["metadata"]["namespace"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "suzumio-orchestrator",
    }
    deployment = one("Deployment", "orchestrator")
    [subject] = binding["subjects"]
    assert (subject["kind"], subject["name"], subject["namespace"]) == (
        "ServiceAccount",
        pod(deployment)["serviceAccountName"],
        deployment["metadata"]["namespace"],
    )
    one("ServiceAccount", subject["name"])
    # The broker's Service as sandboxes reach it, and the labels of its pods for "egress".
    broker = one("Deployment", "toolbroker")
    service = one("Service", "toolbroker")
    url = urlsplit(orchestrator.broker_url)
    assert url.hostname == f"toolbroker.{service['metadata']['namespace']}.svc.cluster.local"
    [port] = service["spec"]["ports"]
    assert url.port == port["port"]
    assert port["targetPort"] in container_ports(broker)
    assert selects(kube.broker_pod_labels, template_labels(broker))
    assert kube.broker_namespace == broker["metadata"]["namespace"]
    with_broker = kube.model_copy(update={"broker_url": orchestrator.broker_url})
    assert egress_warning(with_broker) is None
    runner_image = pod(one("Deployment", "pool-worker"))["containers"][0]["image"]
    assert kube.image.split(":")[0] == runner_image.split(":")[0]
    assert set(orchestrator.pool.pools) == {worker_args(one("Deployment", "pool-worker")).pool}


def worker_args(worker: Manifest) -> argparse.Namespace:
    """The worker's command as `python -m suzumio.runner` parses it (unknown flags fail)."""
    [container] = pod(worker)["containers"]
    assert container["command"][:4] == ["python", "-m", "suzumio.runner", "worker"]
    parser = argparse.ArgumentParser()
    runner_main.add_worker_command(parser.add_subparsers(dest="command"))
    return parser.parse_args(container["command"][3:])


def test_the_pool_worker_gets_only_what_the_worker_reads() -> None:
    worker = one("Deployment", "pool-worker")
    [container] = pod(worker)["containers"]
    reads = set(re.findall(r"os\.environ\.get\(\"(SUZUMIO_\w+)\"", inspect.getsource(runner_main)))
    assert "SUZUMIO_NATS_URL" in reads
    assert set(env_of(container)) <= reads
    args = worker_args(worker)
    assert str(args.workdir) in {m["mountPath"] for m in container["volumeMounts"]}
    hpa = one("HorizontalPodAutoscaler", "pool-worker")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "pool-worker",
    }
    drain = args.drain + args.kill_grace
    assert pod(worker)["terminationGracePeriodSeconds"] > drain


def test_the_pool_worker_is_probed_on_its_health_endpoint() -> None:
    worker = one("Deployment", "pool-worker")
    [container] = pod(worker)["containers"]
    args = worker_args(worker)
    assert args.health_port is not None
    assert args.health_host == "0.0.0.0"  # noqa: S104 - probes come from the node
    expected = {
        "startupProbe": health.HEALTHZ,
        "readinessProbe": health.READYZ,
        "livenessProbe": health.HEALTHZ,
    }
    for probe, path in expected.items():
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert path in health.ROUTES
        port = get["port"]
        assert container_ports(worker).get(port, port) == args.health_port
    # A liveness failure restarts the pod (and drops its warm sessions): not for one slow
    # answer while its runners keep the CPU busy.
    live = container["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] >= 30


# -- references ----------------------------------------------------------------------------


def documented_secrets() -> dict[tuple[str, str], set[str]]:
    """(namespace, name) → keys, of every `kubectl create secret generic` in the docs."""
    text = DOC.read_text().replace("\\\n", " ")
    found: dict[tuple[str, str], set[str]] = {}
    for line in text.splitlines():
        if "create secret generic" not in line:
            continue
        words = shlex.split(line.strip())
        name = words[words.index("generic") + 1]
        namespace = words[words.index("-n") + 1]
        keys = {w.split("=", 2)[1] for w in words if w.startswith("--from-literal=")}
        found[(namespace, name)] = keys
    return found


def test_every_secret_referenced_is_created_by_the_documented_commands() -> None:
    documented = documented_secrets()
    example = {
        (s["metadata"]["namespace"], s["metadata"]["name"]): set(s["stringData"])
        for s in EXAMPLE_SECRETS
    }
    assert documented == example
    assert not objects("Secret")  # never shipped with values
    referenced: set[tuple[str, str, str]] = set()
    for workload in workloads():
        namespace = workload["metadata"]["namespace"]
        for container in pod(workload)["containers"]:
            for entry in container.get("env", []):
                ref = entry.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None:
                    referenced.add((namespace, ref["name"], ref["key"]))
                    key = (namespace, ref["name"])
                    assert key in documented, ref
                    assert ref["key"] in documented[key], ref
    assert {(ns, name) for ns, name, _ in referenced} == set(documented)
    for (namespace, name), keys in documented.items():  # and every key created is read
        assert keys == {k for ns, s, k in referenced if (ns, s) == (namespace, name)}


def test_every_config_map_volume_and_claim_referenced_exists() -> None:
    for workload in workloads():
        namespace = workload["metadata"]["namespace"]
        for volume in pod(workload).get("volumes", []):
            if "configMap" in volume:
                config = one("ConfigMap", volume["configMap"]["name"])
                assert config["metadata"]["namespace"] == namespace
            assert not {"secret", "persistentVolumeClaim", "hostPath"} & set(volume)
        for container in pod(workload)["containers"]:
            for source in container.get("envFrom", []):
                assert (
                    one("ConfigMap", source["configMapRef"]["name"])["metadata"]["namespace"]
                    == namespace
                )
        if "serviceAccountName" in pod(workload):
            account = one("ServiceAccount", pod(workload)["serviceAccountName"])
            assert account["metadata"]["namespace"] == namespace


def test_services_and_budgets_select_real_pods_and_ports() -> None:
    for service in objects("Service"):
        targets = [w for w in workloads() if selects_workload(service, w)]
        assert targets, f"Service {service['metadata']['name']} selects no pod"
        for port in service["spec"]["ports"]:
            assert all(port["targetPort"] in container_ports(w) for w in targets)
    for budget in objects("PodDisruptionBudget"):
        assert [w for w in workloads() if selects_workload(budget, w)]
    for stateful in objects("StatefulSet"):
        service = one("Service", stateful["spec"]["serviceName"])
        assert selects_workload(service, stateful)
    headless = one("Service", one("StatefulSet", "nats")["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"]


# -- NATS ------------------------------------------------------------------------------------


def nats_conf() -> str:
    text: str = one("ConfigMap", "nats-config")["data"]["nats.conf"]
    return text


def test_the_nats_cluster_matches_the_stream_replicas_and_compose() -> None:
    nats = one("StatefulSet", "nats")
    replicas = nats["spec"]["replicas"]
    shared = one("ConfigMap", "suzumio-env")["data"]
    assert int(shared["SUZUMIO_REPLICAS"]) == replicas == 3
    conf = nats_conf()
    namespace, headless = nats["metadata"]["namespace"], nats["spec"]["serviceName"]
    routes = re.findall(r"nats://([\w.-]+):(\d+)", conf)
    assert routes == [
        (
            f"nats-{i}.{headless}.{namespace}.svc.cluster.local",
            str(container_ports(nats)["cluster"]),
        )
        for i in range(replicas)
    ]
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["nats"]["command"]
    payload = compose[compose.index("--max_payload") + 1]
    assert re.search(rf"^max_payload: {payload}$", conf, re.MULTILINE)
    store = re.search(r"store_dir: (\S+)", conf)
    [container] = pod(nats)["containers"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert store is not None
    assert mounts[store[1]] == nats["spec"]["volumeClaimTemplates"][0]["metadata"]["name"]
    assert re.search(r"token: \$NATS_TOKEN", conf)
    assert "no_advertise: true" in conf
    env = env_of(container)
    assert env["NATS_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "suzumio-nats",
        "key": "token",
    }
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    client_url = urlsplit(SECRET_VALUES[("suzumio-nats", "url")])
    service = one("Service", "nats")
    assert client_url.hostname == f"nats.{service['metadata']['namespace']}.svc.cluster.local"
    assert client_url.port == service["spec"]["ports"][0]["port"] == container_ports(nats)["client"]
    assert f"@{client_url.hostname}:{client_url.port}" in DOC.read_text()


# -- network policies ------------------------------------------------------------------------


def namespace_labels(name: str) -> dict[str, str]:
    ours = [ns for ns in objects("Namespace") if ns["metadata"]["name"] == name]
    labels = ours[0]["metadata"].get("labels", {}) if ours else {}  # else another's (keda)
    return {**labels, "kubernetes.io/metadata.name": name}


def admits(policy: Manifest, namespace: str, labels: dict[str, str], port: int) -> bool:
    """Whether an ingress rule of `policy` lets a pod (namespace, labels) in on `port`."""
    for rule in policy["spec"].get("ingress", []):
        ports = [p["port"] for p in rule.get("ports", [])]
        if ports and port not in ports:
            continue
        peers = rule.get("from")
        if peers is None:
            return True
        for peer in peers:
            if "ipBlock" in peer:
                continue
            ns_selector = peer.get("namespaceSelector")
            if ns_selector is None:
                ns_ok = namespace == policy["metadata"]["namespace"]
            else:
                ns_ok = selects(ns_selector.get("matchLabels", {}), namespace_labels(namespace))
            pod_ok = selects(peer.get("podSelector", {}).get("matchLabels", {}), labels)
            if ns_ok and pod_ok:
                return True
    return False


def reachable(
    target: Manifest, namespace: str, labels: dict[str, str], port: int, docs: list[Manifest] = BASE
) -> bool:
    policies = [
        p
        for p in objects("NetworkPolicy", docs)
        if p["metadata"]["namespace"] == target["metadata"]["namespace"]
        and "Ingress" in p["spec"]["policyTypes"]
        and selects(p["spec"]["podSelector"].get("matchLabels", {}), template_labels(target))
    ]
    assert policies, f"nothing restricts ingress to {target['metadata']['name']}"
    return any(admits(p, namespace, labels, port) for p in policies)


def sandbox_pod_labels(monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict[str, str]]:
    """A Job pod as the kubernetes backend renders it with the orchestrator's settings."""
    kube = settings_of(one("Deployment", "orchestrator"), monkeypatch).kubernetes
    job = render(make_plan(), kube)[0]
    labels: dict[str, str] = job["spec"]["template"]["metadata"]["labels"]
    return job["metadata"]["namespace"], labels


def test_nats_and_postgres_admit_the_platform_and_no_sandbox(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nats, postgres = one("StatefulSet", "nats"), one("StatefulSet", "postgres")
    for workload in objects("Deployment"):
        ns, labels = workload["metadata"]["namespace"], template_labels(workload)
        refs = {
            entry["valueFrom"]["secretKeyRef"]["name"]
            for entry in pod(workload)["containers"][0].get("env", [])
            if "secretKeyRef" in entry.get("valueFrom", {})
        }
        assert reachable(nats, ns, labels, 4222) == ("suzumio-nats" in refs)
        assert reachable(postgres, ns, labels, 5432) == ("suzumio-postgres" in refs)
    assert reachable(nats, "suzumio", template_labels(nats), 6222)  # the cluster's routes
    sandbox_ns, sandbox = sandbox_pod_labels(monkeypatch)
    assert not reachable(nats, sandbox_ns, sandbox, 4222)
    assert not reachable(postgres, sandbox_ns, sandbox, 5432)
    for name in ("session", "scheduler", "orchestrator"):  # the gateway is public
        assert not reachable(one("Deployment", name), sandbox_ns, sandbox, 8080)
    assert not reachable(nats, "suzumio", {}, 8222)  # monitoring: closed unless KEDA's is added
    assert reachable(nats, "keda", {}, 8222, [*BASE, *KEDA])


def test_the_sandboxes_and_the_workers_reach_the_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    broker = one("Deployment", "toolbroker")
    sandbox_ns, sandbox = sandbox_pod_labels(monkeypatch)
    assert reachable(broker, sandbox_ns, sandbox, 8080)
    worker = one("Deployment", "pool-worker")
    assert reachable(broker, "suzumio", template_labels(worker), 8080)
    assert not reachable(broker, "suzumio", {"app.kubernetes.io/component": "other"}, 8080)
    assert reachable(one("Deployment", "gateway"), "anywhere", {}, 8080)
    # Each sandbox namespace pod is denied by default; the Job's own policy opens what it needs.
    deny = one("NetworkPolicy", "default-deny")
    assert deny["metadata"]["namespace"] == sandbox_ns
    assert deny["spec"]["podSelector"] == {}
    assert set(deny["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    assert "egress" not in deny["spec"]
    egress = one("NetworkPolicy", "pool-worker-egress")
    assert selects(egress["spec"]["podSelector"]["matchLabels"], template_labels(worker))
    allowed = [
        peer["podSelector"]["matchLabels"]
        for rule in egress["spec"]["egress"]
        for peer in rule["to"]
        if "podSelector" in peer and "namespaceSelector" not in peer
    ]
    assert any(selects(sel, template_labels(broker)) for sel in allowed)
    assert any(selects(sel, template_labels(one("StatefulSet", "nats"))) for sel in allowed)
    assert not any(selects(sel, template_labels(one("StatefulSet", "postgres"))) for sel in allowed)


# -- the orchestrator's Role against the kubernetes backend's calls ----------------------------

API_CLASSES = [getattr(client, name) for name in dir(client) if name.endswith("Api")]
VERBS = {"POST": "create", "PATCH": "patch", "DELETE": "delete", "PUT": "update"}
Grant = tuple[str, str, str]  # (api group, resource, verb); resource "namespaces/<name>" by name


def grant(method: str, path: str, watch: bool) -> Grant | None:
    """The RBAC (group, resource, verb) of one request; None for a non-resource URL."""
    parts = [p for p in path.split("/") if p]
    if parts[0] == "api":
        group, rest = "", parts[2:]
    elif parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        return None  # /version: open to every authenticated client (system:public-info-viewer)
    if rest[0] == "namespaces" and len(rest) == 2:
        resource, named = f"namespaces/{rest[1]}", True
    else:
        resource, named = rest[2], len(rest) == 4
    verb = ("get" if named else "watch" if watch else "list") if method == "GET" else VERBS[method]
    return group, resource, verb


def named_in_the_code(namespace: str) -> set[Grant]:
    """Every API call kubernetes.py names, as a grant in `namespace` (the backend's): its path
    and method from the generated client, `watch` for the list functions it streams."""
    source = inspect.getsource(kubernetes_backend)
    streamed = set(re.findall(r"stream\(\s*[\w.()]*?\.(list_\w+)", source))
    grants: set[Grant] = set()
    verbs = r"(?:create|read|list|patch|delete|replace)_\w+|get_code"
    called = set(re.findall(rf"\.({verbs})\(", source))
    for name, watch in {(n, False) for n in called} | {(n, True) for n in streamed}:
        bodies = {
            inspect.getsource(getattr(api, f"{name}_with_http_info"))
            for api in API_CLASSES
            if hasattr(api, f"{name}_with_http_info")
        }
        if not bodies:
            continue  # not an API call (asyncio's create_task, ...)
        [call] = {re.search(r"'(/[^']+)', '(\w+)'", body).groups() for body in bodies}  # type: ignore[union-attr]
        path, method = call
        # `{name}` is a Job's or, for read_namespace, the backend's namespace itself.
        path = path.replace("{namespace}", namespace).replace("{name}", namespace)
        found = grant(method, path, watch=watch)
        if found is not None:
            grants.add(found)
    return grants


def granted(role: Manifest) -> set[Grant]:
    grants: set[Grant] = set()
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                names = rule.get("resourceNames")
                targets = [f"{resource}/{n}" for n in names] if names else [resource]
                grants |= {(group, t, verb) for t in targets for verb in rule["verbs"]}
    return grants


async def drive(server: FakeKubernetesServer, namespace: str) -> None:
    """Every path of the backend: health, launch (twice: the retried one reads the Job), a
    watch to the Job's end, a watch giving up a pod that cannot start, reconciliation, cancel,
    cleanup (deleting the Job, and keeping it without its Secret) and a dry run."""
    settings = KubernetesSettings(
        namespace=namespace, image="suzumio/runner:t", api_url=server.url, watch_timeout_seconds=5
    )
    backend = KubernetesBackend(settings, "")
    try:
        assert (await backend.health()).ok
        handle = await backend.launch(plan := make_plan())
        assert await backend.launch(plan) == handle
        before = sum(1 for r in server.requests if r.query.get("watch") == "True")
        watching = asyncio.create_task(backend.watch(handle))
        async with asyncio.timeout(10):
            while sum(1 for r in server.requests if r.query.get("watch") == "True") < before + 2:
                await asyncio.sleep(0.01)
        server.finish_job(handle.sandbox_id, exit_code=0)
        assert (await watching).code == 0
        stuck = await backend.launch(make_plan())
        server.stall_pod(stuck.sandbox_id, "InvalidImageName", "no such image")
        assert (await backend.watch(stuck)).reason == "lost"
        assert {h.sandbox_id for h in await backend.list_live()} == {
            handle.sandbox_id,
            stuck.sandbox_id,
        }
        keeping = KubernetesBackend(settings.model_copy(update={"cleanup": "never"}), "")
        try:
            await keeping.cleanup(stuck, succeeded=False)  # kept: its Secret goes
        finally:
            await keeping.close()
        await backend.cancel(stuck)
        await backend.cleanup(handle, succeeded=True)
        await backend.dry_run(make_plan())
    finally:
        await backend.close()


async def test_the_orchestrator_role_grants_exactly_what_the_backend_calls() -> None:
    role = one("Role", "suzumio-orchestrator")
    namespace = role["metadata"]["namespace"]
    async with FakeKubernetesServer(namespaces=[namespace]) as server:
        await drive(server, namespace)
    recorded = {grant(r.method, r.path, r.query.get("watch") == "True") for r in server.requests}
    recorded.discard(None)
    resources = [r.path for r in server.requests if grant(r.method, r.path, watch=False)]
    assert all(f"/namespaces/{namespace}" in path for path in resources)  # its namespace only
    code = named_in_the_code(namespace)
    assert recorded == code, "the drive missed a call the code makes (or the other way round)"
    assert granted(role) == recorded
    assert ("", "secrets", "get") not in granted(role)  # it creates Secrets, never reads one


def test_the_role_check_fails_on_a_missing_or_extra_verb() -> None:
    role = one("Role", "suzumio-orchestrator")
    fewer = {**role, "rules": [{**r, "verbs": r["verbs"][1:]} for r in role["rules"]]}
    more = {
        **role,
        "rules": [*role["rules"], {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
    }
    assert granted(fewer) < granted(role) < granted(more)
    assert grant("GET", "/apis/batch/v1/namespaces/x/jobs", watch=True) == (
        "batch",
        "jobs",
        "watch",
    )
    assert grant("GET", "/api/v1/namespaces/x", watch=False) == ("", "namespaces/x", "get")
    assert grant("GET", "/version", watch=False) is None


def test_the_readme_links_the_guide() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "(docs/kubernetes-deploy.md)" in readme
