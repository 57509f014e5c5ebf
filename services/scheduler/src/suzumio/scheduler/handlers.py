"""The scheduler's commands: what the tool-broker asks at a live activation's tool boundary,
and a cancel of a live activation (the API's, checked by the gateway for the caller's role)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from suzumio.contracts.commands import CancelActivation, CommandAccepted, TakeSignals
from suzumio.contracts.errors import ForbiddenError
from suzumio.platform.bus.commands import CommandContext, CommandRouter

if TYPE_CHECKING:
    from suzumio.scheduler.engine import Scheduler


def build_router(scheduler: Scheduler) -> CommandRouter:
    router = CommandRouter("scheduler")

    async def take_signals(ctx: CommandContext[TakeSignals]) -> CommandAccepted:
        if not ctx.actor.startswith("system:"):
            raise ForbiddenError("signals are handed over to the platform's tool-broker only")
        cmd = ctx.command
        specs = await scheduler.take_signals(cmd.session_id, cmd.activation_id, cmd.received)
        return CommandAccepted(result={"signals": [s.model_dump(mode="json") for s in specs]})

    async def cancel_activation(ctx: CommandContext[CancelActivation]) -> CommandAccepted:
        cmd = ctx.command
        return await scheduler.cancel_activation(
            cmd.activation_id, cmd.project_id, cmd.reason, ctx.meta()
        )

    router.register(TakeSignals, take_signals)
    router.register(CancelActivation, cancel_activation)
    return router
