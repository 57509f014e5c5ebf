"""Settings of the docker backend, and what they and a plan decide before the engine is asked:
the network mode of a profile, which mount targets are allowed, the broker's URL on a bridge."""

from __future__ import annotations

import os
import posixpath
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field

from suzumio.contracts.values import NetworkProfile
from suzumio.orchestrator.backends.base import (
    RESERVED_TARGETS,
    CleanupPolicy,
    LaunchError,
    LaunchPlan,
)

SANDBOX_TMP = "/tmp"  # noqa: S108 - the sandbox's own tmpfs, not ours
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def _default_base_url() -> str:
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


class DockerSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str = Field(default_factory=_default_base_url, description="the engine's API")
    image: str = Field(default="suzumio-runner:latest", description="for profiles without one")
    user: str = Field(default="65534:65534", pattern=r"^\d+:\d+$", description="uid:gid")
    cleanup: CleanupPolicy = "always"
    network_mode_egress: str = Field(
        default="host", description="'host' when the engine has no bridge, else a network name"
    )
    network_mode_full: str | None = Field(default=None, description="default: as for egress")
    stop_grace_seconds: int = Field(default=5, ge=0, le=300, description="SIGTERM → SIGKILL")
    tmp_mb: int = Field(default=256, ge=1, description="size of the /tmp tmpfs (≤ disk_mb)")
    init: bool = Field(default=True, description="the engine's init as pid 1 (reaps, forwards)")
    pull_missing: bool = Field(default=True, description="pull an image the engine lacks")
    api_timeout_seconds: float = Field(default=60.0, gt=0)
    lost_after_seconds: float = Field(
        default=120.0, gt=0, description="a watch gives up on an unreachable engine after this"
    )
    max_threads: int = Field(default=32, ge=2, le=512)


def _is_reserved(target: str) -> bool:
    return target == "/" or any(
        target == r or target.startswith(f"{r}/") for r in (*RESERVED_TARGETS, SANDBOX_TMP)
    )


def check_mounts(plan: LaunchPlan) -> None:
    for mount in plan.mounts:
        target = mount.target
        if not target.startswith("/") or posixpath.normpath(target) != target:
            raise LaunchError(
                f"mount target {target!r} is not a clean absolute path", retryable=False
            )
        if _is_reserved(target):
            raise LaunchError(f"mount target {target!r} is reserved", retryable=False)
        if not mount.host_path.exists():
            raise LaunchError(f"mount source {mount.host_path} does not exist", retryable=False)


def network_mode(settings: DockerSettings, profile: NetworkProfile) -> str:
    """The engine's network mode for a profile: `none`, or the configured one."""
    if profile is NetworkProfile.NONE:
        return "none"
    if profile is NetworkProfile.FULL and settings.network_mode_full:
        return settings.network_mode_full
    return settings.network_mode_egress


def via_gateway(url: str) -> str:
    """A loopback URL as a sandbox on a bridge reaches it: through the host gateway."""
    parts = urlsplit(url)
    if parts.hostname not in _LOOPBACK:
        return url
    netloc = "host.docker.internal" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
