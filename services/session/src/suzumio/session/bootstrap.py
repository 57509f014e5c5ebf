"""Wires the session service: the command handlers, the projector, the expiry clock and the
catch-up reactions."""

from __future__ import annotations

from starlette.types import ASGIApp

from suzumio.platform.bus.commands import CommandServer
from suzumio.platform.projections import load_projections
from suzumio.platform.projections.projector import Projector
from suzumio.platform.service import ServiceRuntime
from suzumio.session.expiry import ExpiryClock
from suzumio.session.handlers import build_router
from suzumio.session.handlers.base import Context, utcnow
from suzumio.session.reactions import ResumeSignals
from suzumio.session.repository import Repository
from suzumio.session.settings import SessionSettings


async def setup(runtime: ServiceRuntime) -> ASGIApp | None:
    settings = runtime.settings
    assert isinstance(settings, SessionSettings)
    repo = Repository(runtime.store)
    context = Context(
        repo, settings.allowed_mount_roots(), utcnow, reserved_dirs=settings.reserved_dirs()
    )
    router = build_router(context)
    expiry = ExpiryClock(runtime.pool, router, utcnow)
    context.on_pending_action = expiry.notify
    server = CommandServer(runtime.nc, runtime.topology, router)
    await server.start()
    runtime.on_drain(server.drain)
    runtime.background("expiry", expiry.run)
    runtime.background(
        "resume-signals", ResumeSignals(runtime.nc, runtime.topology, repo).worker.run
    )
    if settings.run_projector:
        projector = Projector(
            runtime.nc,
            runtime.database_url,
            runtime.topology,
            load_projections(),
            runtime.store,
            batch=settings.projector_batch,
        )
        runtime.background("projector", projector.run)
    return None
