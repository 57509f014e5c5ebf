from __future__ import annotations

from pydantic import Field

from suzumio.contracts.values import Backend
from suzumio.platform.settings import ServiceSettings


class SchedulerSettings(ServiceSettings):
    http_port: int = Field(default=8092, ge=0, le=65_535)
    max_batch: int = Field(default=64, ge=1, le=1_000, description="signals per activation start")
    retry_budget: int = Field(
        default=3, ge=1, le=20, description="failed activations a signal may be part of"
    )
    retry_backoff_seconds: tuple[float, ...] = Field(
        default=(2.0, 10.0, 60.0),
        min_length=1,
        description="wait after the 1st, 2nd, ... consecutive failure of a session (JSON list)",
    )
    pool_limits: dict[str, int] = Field(
        default_factory=dict,
        description='max live activations per pool (JSON, e.g. {"docker": 20}); unset: none',
    )
    default_backend: Backend = Field(
        default=Backend.PROCESS,
        description="the orchestrator's SUZUMIO_DEFAULT_BACKEND (set it on both): the pool "
        "that activations of agents without a runtime profile count against",
    )
    hooks: tuple[str, ...] = Field(
        default=(),
        description="extra scheduler hooks as `module:attribute` (JSON list), after the "
        "entry points of group suzumio.scheduler_hooks",
    )
    hook_timeout_seconds: float = Field(default=2.0, gt=0, le=60)
    review_window_seconds: float = Field(
        default=600.0,
        gt=0,
        description="an activation that ended longer ago than this (e.g. while no scheduler "
        "ran) is not shown to the hooks or nudged any more",
    )
