"""Agents."""

from __future__ import annotations

from typing import Any

from suzumio.contracts.commands import (
    CommandAccepted,
    CreateAgent,
    DisableAgent,
    EnableAgent,
    UpdateAgent,
)
from suzumio.contracts.errors import NotFoundError
from suzumio.contracts.values import Role
from suzumio.platform.bus.commands import CommandContext
from suzumio.session.domain import agent
from suzumio.session.domain.agent import AgentState
from suzumio.session.handlers.base import HandlerGroup, accepted


class AgentHandlers(HandlerGroup):
    async def create_agent(self, ctx: CommandContext[CreateAgent]) -> CommandAccepted:
        cmd = ctx.command
        actor = await self.actor(ctx)
        project, _ = await self.project_role(cmd.project_id, actor, Role.ADMIN, "project")
        _, result = await self.repo.execute(
            AgentState, cmd.agent_id, lambda s: agent.create(s, project, cmd), ctx.meta()
        )
        return accepted(result, agent_id=cmd.agent_id)

    async def _agent(self, ctx: CommandContext[Any], agent_id: str) -> AgentState:
        state = await self.repo.get(AgentState, agent_id)
        if not state.exists:
            raise NotFoundError("agent not found")
        await self.project_role(state.project_id, await self.actor(ctx), Role.ADMIN, "agent")
        return state

    async def update_agent(self, ctx: CommandContext[UpdateAgent]) -> CommandAccepted:
        cmd = ctx.command
        state = await self._agent(ctx, cmd.agent_id)
        project, _ = await self.project_role(
            state.project_id, await self.actor(ctx), Role.ADMIN, "agent"
        )
        _, result = await self.repo.execute(
            AgentState, cmd.agent_id, lambda s: agent.update(s, project, cmd), ctx.meta()
        )
        return accepted(result, agent_id=cmd.agent_id)

    async def disable_agent(self, ctx: CommandContext[DisableAgent]) -> CommandAccepted:
        cmd = ctx.command
        await self._agent(ctx, cmd.agent_id)
        _, result = await self.repo.execute(
            AgentState, cmd.agent_id, lambda s: agent.disable(s, cmd), ctx.meta()
        )
        return accepted(result, agent_id=cmd.agent_id)

    async def enable_agent(self, ctx: CommandContext[EnableAgent]) -> CommandAccepted:
        cmd = ctx.command
        await self._agent(ctx, cmd.agent_id)
        _, result = await self.repo.execute(
            AgentState, cmd.agent_id, lambda s: agent.enable(s, cmd), ctx.meta()
        )
        return accepted(result, agent_id=cmd.agent_id)
