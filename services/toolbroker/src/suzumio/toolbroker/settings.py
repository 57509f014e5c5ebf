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
    # The same variables as the orchestrator's (SUZUMIO_MAX_ARTIFACT_BYTES, …): what a sandbox
    # may send back from `/workspace/out` through the broker (kubernetes).
    max_artifact_bytes: int = Field(default=100 * 1024 * 1024, ge=1)
    max_artifacts: int = Field(default=200, ge=0)
    max_body_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=1024,
        description="the largest request body, refused with 413 before it is read (stricter "
        "for small calls; output files are bounded by max_artifact_bytes instead)",
    )
    credential_refresh_seconds: float = Field(
        default=10.0,
        ge=0,
        le=3_600,
        description="an activation gets a provider's current key (`POST /runner/credentials`) "
        "at most once in this many seconds per provider, on each replica",
    )
