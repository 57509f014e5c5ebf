from __future__ import annotations

from pydantic import Field

from suzumio.platform.settings import ServiceSettings


class OrchestratorSettings(ServiceSettings):
    http_port: int = Field(default=8093, ge=0, le=65_535)
