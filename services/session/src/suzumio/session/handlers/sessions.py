"""Sessions, their messages and signals."""

from __future__ import annotations

from typing import Any

from suzumio.contracts.commands import (
    CloseSession,
    CommandAccepted,
    OpenSession,
    PostMessage,
    RecordSignal,
    ReopenSession,
)
from suzumio.contracts.errors import NotFoundError
from suzumio.contracts.values import Author, Role
from suzumio.platform.bus.commands import CommandContext
from suzumio.session.domain import session
from suzumio.session.domain.agent import AgentState
from suzumio.session.domain.session import SessionState
from suzumio.session.handlers.base import HandlerGroup, accepted


class SessionHandlers(HandlerGroup):
    async def open_session(self, ctx: CommandContext[OpenSession]) -> CommandAccepted:
        cmd = ctx.command
        agent = await self.repo.get(AgentState, cmd.agent_id)
        if not agent.exists:
            raise NotFoundError("agent not found")
        await self.project_role(agent.project_id, await self.actor(ctx), Role.MEMBER, "agent")
        _, result = await self.repo.execute(
            SessionState, cmd.session_id, lambda s: session.open_(s, agent, cmd), ctx.meta()
        )
        return accepted(result, session_id=cmd.session_id, project_id=agent.project_id)

    async def writable(self, ctx: CommandContext[Any], session_id: str) -> SessionState:
        """The session, if the actor may write to it (a member of its project)."""
        state = await self.repo.get(SessionState, session_id, fresh=False)
        if not state.exists:
            state = await self.repo.get(SessionState, session_id)
            if not state.exists:
                raise NotFoundError("session not found")
        await self.project_role(state.project_id, await self.actor(ctx), Role.MEMBER, "session")
        return state

    async def close_session(self, ctx: CommandContext[CloseSession]) -> CommandAccepted:
        cmd = ctx.command
        await self.writable(ctx, cmd.session_id)
        _, result = await self.repo.execute(
            SessionState, cmd.session_id, lambda s: session.close(s, cmd), ctx.meta()
        )
        return accepted(result, session_id=cmd.session_id)

    async def reopen_session(self, ctx: CommandContext[ReopenSession]) -> CommandAccepted:
        cmd = ctx.command
        await self.writable(ctx, cmd.session_id)
        _, result = await self.repo.execute(
            SessionState, cmd.session_id, lambda s: session.reopen(s, cmd), ctx.meta()
        )
        return accepted(result, session_id=cmd.session_id)

    async def post_message(self, ctx: CommandContext[PostMessage]) -> CommandAccepted:
        cmd = ctx.command
        actor = await self.actor(ctx)
        author = Author(kind="user" if actor.user_id else "system", id=actor.id)
        await self.writable(ctx, cmd.session_id)
        _, result = await self.repo.execute(
            SessionState,
            cmd.session_id,
            lambda s: session.post_message(s, cmd, author),
            ctx.meta(),
        )
        return accepted(result, message_id=cmd.message_id, signal_id=cmd.signal_id)

    async def record_signal(self, ctx: CommandContext[RecordSignal]) -> CommandAccepted:
        cmd = ctx.command
        by_user = (await self.actor(ctx)).kind == "user"
        await self.writable(ctx, cmd.session_id)
        _, result = await self.repo.execute(
            SessionState,
            cmd.session_id,
            lambda s: session.record_signal(s, cmd, by_user=by_user),
            ctx.meta(),
        )
        return accepted(result, signal_id=cmd.signal_id)
