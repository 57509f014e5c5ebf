from __future__ import annotations

from pydantic import Field

from suzumio.platform.settings import ServiceSettings


class GatewaySettings(ServiceSettings):
    http_port: int = Field(default=8080, ge=0, le=65_535)
