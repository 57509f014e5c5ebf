from __future__ import annotations

from pydantic import Field

from suzumio.platform.settings import ServiceSettings


class SchedulerSettings(ServiceSettings):
    http_port: int = Field(default=8092, ge=0, le=65_535)
