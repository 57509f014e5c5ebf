from __future__ import annotations

from pydantic import Field

from suzumio.platform.settings import ServiceSettings


class GatewaySettings(ServiceSettings):
    http_port: int = Field(default=8080, ge=0, le=65_535)
    max_upload_bytes: int = Field(default=100 * 1024 * 1024, ge=1, description="per file")
    max_upload_request_bytes: int = Field(
        default=1024 * 1024 * 1024, ge=1, description="all the files of one upload together"
    )
    max_package_bytes: int = Field(default=20 * 1024 * 1024, ge=1)
    idempotency_ttl_seconds: int = Field(default=24 * 3_600, ge=60)
    read_your_writes_timeout: float = Field(default=10.0, gt=0, le=60)
    command_timeout: float = Field(default=10.0, gt=0, le=120)
    stream_recheck_seconds: float = Field(
        default=15.0,
        gt=0,
        le=300,
        description="how often an open stream re-checks its key and the caller's access",
    )
    stream_write_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        le=3_600,
        description="a stream (SSE or WebSocket) whose client takes none of a write's bytes for "
        "this long is ended (the client resumes from its cursor)",
    )
    stream_max_per_user: int = Field(
        default=32,
        ge=1,
        le=10_000,
        description="timeline streams (SSE and WebSocket) one user may have open at once on a "
        "gateway replica; one more is a 429",
    )
