from __future__ import annotations

from pydantic import Field

from suzumio.platform.settings import ServiceSettings


class SessionSettings(ServiceSettings):
    http_port: int = Field(default=8091, ge=0, le=65_535)
    projector_batch: int = Field(default=1_000, ge=1, le=10_000)
    run_projector: bool = Field(default=True, description="host the projector (one leads)")
