"""Wires the gateway: read models, commands, buckets, and the FastAPI application."""

from __future__ import annotations

from starlette.types import ASGIApp

from suzumio.contracts.subjects import ARTIFACTS_BUCKET
from suzumio.gateway.api.app import create_app
from suzumio.gateway.api.auth import KeyCache
from suzumio.gateway.livehub import LiveHub
from suzumio.gateway.settings import GatewaySettings
from suzumio.gateway.state import Gateway
from suzumio.platform.bus.kv import ensure_kv, ensure_object_store
from suzumio.platform.projections.positions import PositionWatcher
from suzumio.platform.secrets import secret_box
from suzumio.platform.service import ServiceRuntime
from suzumio.platform.service.heartbeat import BUCKET as SERVICES_BUCKET
from suzumio.platform.service.heartbeat import TTL_SECONDS

IDEMPOTENCY_BUCKET = "idempotency"


async def setup(runtime: ServiceRuntime) -> ASGIApp | None:
    settings = runtime.settings
    assert isinstance(settings, GatewaySettings)
    js = runtime.nc.jetstream()
    topology = runtime.topology
    replicas = settings.replicas
    idempotency = await ensure_kv(
        js,
        topology.bucket(IDEMPOTENCY_BUCKET),
        ttl=settings.idempotency_ttl_seconds,
        replicas=replicas,
    )
    services = await ensure_kv(
        js, topology.bucket(SERVICES_BUCKET), ttl=TTL_SECONDS, replicas=replicas
    )
    artifacts_bucket = topology.bucket(ARTIFACTS_BUCKET)
    artifacts = await ensure_object_store(js, artifacts_bucket, replicas=replicas)
    positions = PositionWatcher(runtime.database_url)
    runtime.background("positions", positions.run)
    gateway = Gateway(
        settings=settings,
        nc=runtime.nc,
        pool=runtime.pool,
        topology=topology,
        commands=runtime.commands(timeout=settings.command_timeout),
        positions=positions,
        secrets=secret_box(settings),
        keys=KeyCache(runtime.pool),
        artifacts=artifacts,
        artifacts_bucket=artifacts_bucket,
        services=services,
        idempotency=idempotency,
        live=LiveHub(runtime.nc, topology),
    )
    runtime.on_drain(lambda _: gateway.live.close())
    return create_app(gateway, runtime.readiness.routes())
