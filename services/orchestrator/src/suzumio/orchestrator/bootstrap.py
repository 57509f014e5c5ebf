"""Wires the orchestrator: the planner, the enabled backends, the artifact collector and the
engine that follows the log."""

from __future__ import annotations

from starlette.types import ASGIApp

from suzumio.contracts.subjects import ARTIFACTS_BUCKET
from suzumio.orchestrator.artifacts import ArtifactCollector
from suzumio.orchestrator.backends.base import Backend
from suzumio.orchestrator.backends.process import ProcessBackend
from suzumio.orchestrator.engine import Orchestrator
from suzumio.orchestrator.planning import Planner
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.platform.bus.kv import ensure_object_store
from suzumio.platform.secrets import SecretBox, secret_keys
from suzumio.platform.service import ServiceRuntime
from suzumio.platform.tokens import TokenSigner


async def build_backends(
    runtime: ServiceRuntime,  # noqa: ARG001 - the pool backend will need its connection
    settings: OrchestratorSettings,
) -> dict[str, Backend]:
    backends: dict[str, Backend] = {}
    for name in settings.backends:
        match name.value:
            case "process":
                backends["process"] = ProcessBackend(settings.sandboxes())
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
    runtime.background("orchestrator", orchestrator.run)
    runtime.on_drain(lambda _: orchestrator.close())
    return None
