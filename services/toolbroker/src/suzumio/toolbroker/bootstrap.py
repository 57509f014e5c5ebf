"""Wires the toolbroker: a FastAPI application carrying the health endpoints."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.types import ASGIApp

from suzumio.platform.service import ServiceRuntime


async def setup(runtime: ServiceRuntime) -> ASGIApp | None:
    app = FastAPI(title="Suzumio tool-broker", version="0.1.0")
    for route in runtime.readiness.routes():
        app.router.routes.append(route)
    return app
