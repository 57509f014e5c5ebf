"""Wires the scheduler service: the log follower, leadership, and the hooks."""

from __future__ import annotations

from starlette.types import ASGIApp

from suzumio.contracts.toolpacks import discover
from suzumio.platform.service import ServiceRuntime
from suzumio.scheduler.engine import Scheduler
from suzumio.scheduler.hooks import Hooks, load_hooks
from suzumio.scheduler.settings import SchedulerSettings


async def setup(runtime: ServiceRuntime) -> ASGIApp | None:
    settings = runtime.settings
    assert isinstance(settings, SchedulerSettings)
    # Installed toolpacks' own hooks too, each for the agents that enable its toolpack.
    found = load_hooks(settings.hooks, discover())
    hooks = Hooks(found, timeout=settings.hook_timeout_seconds)
    scheduler = Scheduler(
        runtime.nc,
        runtime.topology,
        runtime.store,
        runtime.commands(),
        runtime.database_url,
        settings,
        hooks,
    )
    # Ready once the log is folded: a standby that has not caught up cannot take over.
    runtime.readiness.extra_checks["caught_up"] = lambda: scheduler.caught_up
    runtime.background("scheduler", scheduler.run)
    return None
