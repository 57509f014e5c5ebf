"""Wires the orchestrator service. Its consumers arrive with its own issue; until then it runs the
service skeleton (health, readiness, metrics, draining) so `suzumio up` supervises it."""

from __future__ import annotations

from starlette.types import ASGIApp

from suzumio.platform.service import ServiceRuntime


async def setup(runtime: ServiceRuntime) -> ASGIApp | None:  # noqa: ARG001
    return None
