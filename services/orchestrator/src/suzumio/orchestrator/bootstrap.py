"""Wires the orchestrator: the planner, the enabled backends, the artifact collector and the
engine that follows the log."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from starlette.types import ASGIApp

from suzumio.contracts.subjects import ARTIFACTS_BUCKET
from suzumio.orchestrator import metrics
from suzumio.orchestrator.artifacts import ArtifactCollector
from suzumio.orchestrator.backends.base import Backend
from suzumio.orchestrator.backends.docker import DockerBackend
from suzumio.orchestrator.backends.kubernetes import KubernetesBackend
from suzumio.orchestrator.backends.pool import PoolBackend
from suzumio.orchestrator.backends.process import ProcessBackend
from suzumio.orchestrator.engine import Orchestrator
from suzumio.orchestrator.planning import Planner
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.platform.bus.installation import installation_id
from suzumio.platform.bus.kv import ensure_object_store
from suzumio.platform.secrets import SecretBox, secret_keys
from suzumio.platform.service import ServiceRuntime
from suzumio.platform.tokens import TokenSigner

HEALTH_SECONDS = 10.0


async def build_backends(
    runtime: ServiceRuntime, settings: OrchestratorSettings
) -> dict[str, Backend]:
    """The backends this orchestrator runs (`SUZUMIO_BACKENDS`); a backend whose engine is
    unreachable at start is still built: its health says so and its launches fail."""
    backends: dict[str, Backend] = {}
    namespace = runtime.topology.namespace
    installation = await installation_id(
        runtime.nc.jetstream(), runtime.topology, replicas=settings.replicas
    )
    for name in settings.backends:
        match name.value:
            case "process":
                backends["process"] = ProcessBackend(
                    settings.sandboxes(), settings.process, Path(settings.data_dir)
                )
            case "docker":
                backends["docker"] = DockerBackend(settings.docker, namespace, installation)
            case "kubernetes":
                kubernetes = settings.kubernetes
                if kubernetes.broker_url is None:
                    kubernetes = kubernetes.model_copy(update={"broker_url": settings.broker_url})
                backends["kubernetes"] = KubernetesBackend(kubernetes, namespace, installation)
            case "pool":
                backends["pool"] = PoolBackend(runtime.nc, runtime.topology, settings.pool)
    return backends


async def setup(runtime: ServiceRuntime) -> ASGIApp | None:
    settings = runtime.settings
    assert isinstance(settings, OrchestratorSettings)
    keys = secret_keys(settings)
    js = runtime.nc.jetstream()
    bucket = runtime.topology.bucket(ARTIFACTS_BUCKET)
    objects = await ensure_object_store(js, bucket, replicas=settings.replicas)
    commands = runtime.commands()
    orchestrator = Orchestrator(
        runtime.nc,
        runtime.topology,
        runtime.store,
        runtime.database_url,
        Planner(
            runtime.store, TokenSigner(keys), SecretBox(keys), settings, runtime.topology.namespace
        ),
        await build_backends(runtime, settings),
        ArtifactCollector(
            js,
            objects,
            bucket,
            runtime.pool,
            commands,
            max_bytes=settings.max_artifact_bytes,
            max_files=settings.max_artifacts,
        ),
        settings.workspace_retention_hours,
    )
    runtime.readiness.extra_checks["caught_up"] = lambda: orchestrator.caught_up
    metrics.watch(orchestrator)

    async def report_health(stop: asyncio.Event) -> None:
        """Each backend's health in this instance's heartbeat (cluster status shows it)."""
        while not stop.is_set():
            runtime.status["backends"] = await orchestrator.backend_health()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), HEALTH_SECONDS)

    runtime.background("backend-health", report_health)
    runtime.background("orchestrator", orchestrator.run)
    runtime.on_drain(lambda _: orchestrator.close())
    return None
