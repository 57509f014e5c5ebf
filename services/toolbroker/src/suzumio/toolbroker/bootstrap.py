"""Wires the tool-broker: the activation registry, the token gate, the runner API."""

from __future__ import annotations

from datetime import timedelta

from fastapi import FastAPI
from starlette.types import ASGIApp

from suzumio.contracts.subjects import ARTIFACTS_BUCKET
from suzumio.contracts.toolpacks import discover
from suzumio.platform.bus.kv import ensure_object_store
from suzumio.platform.logging import get_logger
from suzumio.platform.secrets import SecretBox, SecretError, secret_keys
from suzumio.platform.service import BodyLimits, ServiceRuntime
from suzumio.platform.tokens import TokenSigner
from suzumio.toolbroker import credentials, files, model_relay
from suzumio.toolbroker.access import Gate
from suzumio.toolbroker.credentials import CredentialDesk
from suzumio.toolbroker.model_relay import ModelRelay, Upstream
from suzumio.toolbroker.pending import PendingWaiter
from suzumio.toolbroker.problems import HANDLERS
from suzumio.toolbroker.registry import ActivationRegistry
from suzumio.toolbroker.routes import MAX_CHECKPOINT_BYTES, MAX_STREAM_BATCH_CHARS, router
from suzumio.toolbroker.settings import ToolbrokerSettings
from suzumio.toolbroker.signed_first import SignedFirst
from suzumio.toolbroker.state import Artifacts, Broker, Metrics
from suzumio.toolbroker.support import SupportOperations

log = get_logger(__name__)


def body_limits(settings: ToolbrokerSettings) -> BodyLimits:
    """Room for the largest valid call of each route, and no more: a final call or a support
    call may carry megabytes of text, an audit record or a question never does."""
    return BodyLimits(
        settings.max_body_bytes,
        {
            "/runner/tool-calls/": 64 * 1024,
            "/runner/credentials": 64 * 1024,
            "/runner/signals": 1024 * 1024,  # 10,000 ids of 64 characters, quoted
            "/runner/ask": 1024 * 1024,
            "/runner/checkpoint": 8 * MAX_CHECKPOINT_BYTES,  # JSON escapes may grow it
            # A whole batch's characters, each escaped as `\u0000` (6 bytes), fit; what is
            # larger is refused before it is read, by whoever sends it, token or none.
            "/runner/stream": 6 * MAX_STREAM_BATCH_CHARS,
            "/runner/files/out/": settings.max_artifact_bytes,
        },
    )


def credential_desk(settings: ToolbrokerSettings) -> CredentialDesk | None:
    """What opens provider keys for runners: the platform's secret keys, as the orchestrator
    opens them at launch. Keys that are not Fernet keys seal nothing, so there is nothing to
    open: the route then says so (404), and runners fall back as before."""
    try:
        box = SecretBox(secret_keys(settings))
    except SecretError as exc:
        log.warning("credentials.no_secret_box", error=str(exc))
        return None
    return CredentialDesk(box, settings.credential_refresh_seconds)


# Every activation's calls, the most frequent first (a batch of live output every 20 ms).
HOT_PATHS = {
    path: rank
    for rank, path in enumerate(
        (
            "/runner/stream",
            "/activation-output",
            "/runner/tool-calls/start",
            "/runner/tool-calls/finish",
            "/runner/history",
        )
    )
}


def create_app(broker: Broker) -> FastAPI:
    # FastAPI's own OpenTelemetry (on once providers are installed) without its spans around
    # every dependency, endpoint and serialization, nor log records (structlog has the errors):
    # they cost a request a quarter of its CPU. Request spans and metrics stay.
    app = FastAPI(
        title="Suzumio tool-broker",
        version="0.1.0",
        telemetry={"operation_spans": False, "logs": False},
    )
    app.state.broker = broker
    for exc_type, handler in HANDLERS.items():
        app.add_exception_handler(exc_type, handler)
    # A request's path is matched against each route in turn (~3 µs a route, 40 µs for the
    # activation's output, defined last): the calls every activation makes come first.
    router.routes.sort(key=lambda route: HOT_PATHS.get(getattr(route, "path", ""), len(HOT_PATHS)))
    app.include_router(router)
    app.include_router(files.router)
    app.include_router(credentials.router)
    app.include_router(model_relay.router)
    return app


def relay(settings: ToolbrokerSettings) -> ModelRelay | None:
    """The model relay, where sandboxes without any network reach this broker (its Unix
    socket); the platform's default endpoint as this broker's environment names it."""
    if settings.broker_socket is None:
        return None
    default = None
    if settings.model_base_url:
        key = settings.model_api_key.get_secret_value() if settings.model_api_key else None
        default = Upstream(settings.model_base_url, key or None)
    return ModelRelay(
        default,
        settings.relay_read_timeout_seconds,
        allow_private=settings.relay_allow_private_providers,
        call_seconds=settings.relay_call_seconds,
        max_calls_per_project=settings.relay_max_calls_per_project,
    )


async def setup(runtime: ServiceRuntime) -> ASGIApp | None:
    settings = runtime.settings
    assert isinstance(settings, ToolbrokerSettings)
    registry = ActivationRegistry(
        runtime.nc, runtime.topology, timedelta(hours=settings.lookback_hours)
    )
    await registry.start()
    waiter = PendingWaiter(runtime.nc, runtime.topology, runtime.store)
    await waiter.start()
    js = runtime.nc.jetstream()
    bucket = runtime.topology.bucket(ARTIFACTS_BUCKET)
    artifacts = Artifacts(
        store=await ensure_object_store(js, bucket, replicas=settings.replicas),
        bucket=bucket,
        max_files=settings.max_artifacts,
        max_bytes=settings.max_artifact_bytes,
    )
    manifests = discover()
    signer = TokenSigner(secret_keys(settings))
    broker = Broker(
        nc=runtime.nc,
        js=js,
        topology=runtime.topology,
        store=runtime.store,
        commands=runtime.commands(),
        registry=registry,
        operations=SupportOperations(manifests),
        metrics=Metrics.of(manifests),
        gate=Gate(signer, registry, runtime.store),
        waiter=waiter,
        artifacts=artifacts,
        credentials=credential_desk(settings),
        relay=relay(settings),
        live_budget=settings.live_bytes_per_activation,
        max_tool_calls=settings.max_tool_calls_per_activation,
        log_budget=settings.log_bytes_per_activation,
    )

    # The relay's client is not closed here: drainers run before the HTTP server stops, and
    # model streams it relays must be able to finish meanwhile. It goes with the process.
    async def closing(_: float) -> None:
        await waiter.close()
        await registry.close()

    runtime.on_drain(closing)
    runtime.limit_bodies(body_limits(settings))
    if settings.broker_socket is not None:
        runtime.serve_unix(settings.broker_socket)
    app = create_app(broker)
    for route in runtime.readiness.routes():
        app.router.routes.append(route)
    return SignedFirst(app, signer)
