"""Wires the session service: its command server and the projector."""

from __future__ import annotations

from starlette.types import ASGIApp

from suzumio.platform.bus.commands import CommandServer
from suzumio.platform.projections import load_projections
from suzumio.platform.projections.projector import Projector
from suzumio.platform.service import ServiceRuntime
from suzumio.session.handlers import build_router
from suzumio.session.settings import SessionSettings


async def setup(runtime: ServiceRuntime) -> ASGIApp | None:
    settings = runtime.settings
    assert isinstance(settings, SessionSettings)
    server = CommandServer(runtime.nc, runtime.topology, build_router(runtime.store))
    await server.start()
    runtime.on_drain(server.drain)
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
