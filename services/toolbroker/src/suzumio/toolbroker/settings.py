from __future__ import annotations

from pydantic import Field

from suzumio.platform.settings import ServiceSettings


class ToolbrokerSettings(ServiceSettings):
    http_port: int = Field(default=8081, ge=0, le=65_535)
    http_host: str = Field(
        default="127.0.0.1",
        description="where sandboxes reach the broker; 0.0.0.0 when they run on other hosts",
    )
    lookback_hours: float = Field(
        default=24.0,
        gt=0,
        le=24 * 30,
        description="how much recent log a replica folds on start; older activations are "
        "looked up when their token is first seen",
    )
