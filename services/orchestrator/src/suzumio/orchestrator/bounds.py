"""What the operator lets a project's runtime profile ask for (`SUZUMIO_BOUNDS__*`).

A project's admin sets its runtime profiles: the image its sandboxes run and their limits, up to
the contract's own ceilings (a terabyte of memory, a million processes, a week). Those ceilings
say what a value can be, not what this installation can give: here the operator says that, and
which images may run — the engine pulls a profile's image with the orchestrator's registry
credentials, so without a list any project could run any image those credentials reach. An
activation whose profile asks for more is failed as it is planned (not retried: the same plan
would ask again), saying what was asked and what is allowed. Unset, a bound allows anything.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Collection
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

from suzumio.contracts.values import Backend, RuntimeProfileSpec

IMAGE_BACKENDS = frozenset({Backend.DOCKER, Backend.KUBERNETES})


class SandboxBounds(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_cpus: float | None = Field(default=None, gt=0, description="CPUs a sandbox may ask for")
    max_memory_mb: int | None = Field(default=None, ge=64, description="memory, MiB")
    max_disk_mb: int | None = Field(default=None, ge=16, description="disk, MiB")
    max_pids: int | None = Field(default=None, ge=16, description="processes")
    max_wall_clock_seconds: int | None = Field(
        default=None, ge=1, description="an activation's wall-clock limit"
    )
    images: tuple[str, ...] | None = Field(
        default=None,
        description="the images a profile may name (docker, kubernetes), as written in it; "
        "shell-style patterns (`registry.example.com/agents/*`). Unset: any image. The "
        "backends' own default images are allowed whatever this says",
    )

    def clamp(self, profile: RuntimeProfileSpec) -> RuntimeProfileSpec:
        """`profile` within the bounds: for the platform's default profile (agents without
        one of their own), whose limits nobody chose to ask for — an operator's bound below a
        default must not fail every such agent."""
        limits, timeouts = profile.limits, profile.timeouts
        return profile.model_copy(
            update={
                "limits": limits.model_copy(
                    update={
                        "cpus": _least(limits.cpus, self.max_cpus),
                        "memory_mb": _least(limits.memory_mb, self.max_memory_mb),
                        "disk_mb": _least(limits.disk_mb, self.max_disk_mb),
                        "pids": _least(limits.pids, self.max_pids),
                    }
                ),
                "timeouts": timeouts.model_copy(
                    update={
                        "wall_clock_seconds": _least(
                            timeouts.wall_clock_seconds, self.max_wall_clock_seconds
                        )
                    }
                ),
            }
        )

    def refusal(self, profile: RuntimeProfileSpec, default_images: Collection[str]) -> str | None:
        """Why `profile` may not run here; None when it may."""
        limits = profile.limits
        asked = (
            ("CPUs", limits.cpus, self.max_cpus, "MAX_CPUS"),
            ("MiB of memory", limits.memory_mb, self.max_memory_mb, "MAX_MEMORY_MB"),
            ("MiB of disk", limits.disk_mb, self.max_disk_mb, "MAX_DISK_MB"),
            ("processes", limits.pids, self.max_pids, "MAX_PIDS"),
            (
                "seconds of wall clock",
                profile.timeouts.wall_clock_seconds,
                self.max_wall_clock_seconds,
                "MAX_WALL_CLOCK_SECONDS",
            ),
        )
        for what, value, bound, name in asked:
            if bound is not None and value > bound:
                return (
                    f"the runtime profile asks for {_shown(value)} {what}; this platform "
                    f"allows at most {_shown(bound)} (SUZUMIO_BOUNDS__{name})"
                )
        image = profile.image
        if (
            self.images is not None
            and image is not None
            and profile.backend in IMAGE_BACKENDS
            and image not in default_images
            and not any(fnmatch.fnmatchcase(image, pattern) for pattern in self.images)
        ):
            return (
                f"the runtime profile's image {image!r} is not one this platform runs "
                "(SUZUMIO_BOUNDS__IMAGES)"
            )
        return None


N = TypeVar("N", int, float)


def _least(value: N, bound: N | None) -> N:
    return value if bound is None or value <= bound else bound


def _shown(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
