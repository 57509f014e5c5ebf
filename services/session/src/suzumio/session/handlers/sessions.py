"""Sessions, their messages and signals."""

from __future__ import annotations

from typing import Any

from suzumio.contracts.commands import (
    AppendHistory,
    CloseSession,
    CommandAccepted,
    CompactHistory,
    OpenSession,
    PostMessage,
    RecordSignal,
    ReopenSession,
    SaveCheckpoint,
)
from suzumio.contracts.errors import ForbiddenError, NotFoundError
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
        if not state.exists:  # opened a moment ago, maybe: as the log's leader has it
            state = await self.repo.latest(SessionState, session_id)
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
        if actor.user_id:
            author = Author(kind="user", id=actor.id)
        elif actor.id.startswith("agent:"):  # an agent's message, sent by the tool-broker
            author = Author(kind="agent", id=actor.id.removeprefix("agent:"))
        else:
            author = Author(kind="system", id=actor.id)
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

    # -- written for a live activation, by the tool-broker (which checked its token) --------
    async def platform_session(self, ctx: CommandContext[Any], session_id: str) -> SessionState:
        if (await self.actor(ctx)).kind != "system":
            raise ForbiddenError("only the platform writes an activation's history")
        # As held, if it is: the append that follows is conditional on this state's version,
        # and decides again on the latest if another writer moved it (a cancel, the next
        # request). Checked with the log first, every entry an activation sent cost a read.
        state = await self.repo.get(SessionState, session_id, fresh=False)
        if not state.exists:
            raise NotFoundError("session not found")
        return state

    async def append_history(self, ctx: CommandContext[AppendHistory]) -> CommandAccepted:
        cmd = ctx.command
        await self.platform_session(ctx, cmd.session_id)
        _, result = await self.repo.execute(
            SessionState, cmd.session_id, lambda s: session.append_history(s, cmd), ctx.meta()
        )
        return accepted(result, appended=len(result.events))

    async def compact_history(self, ctx: CommandContext[CompactHistory]) -> CommandAccepted:
        cmd = ctx.command
        await self.platform_session(ctx, cmd.session_id)
        _, result = await self.repo.execute(
            SessionState, cmd.session_id, lambda s: session.compact_history(s, cmd), ctx.meta()
        )
        return accepted(result, marker_id=cmd.marker_id)

    async def save_checkpoint(self, ctx: CommandContext[SaveCheckpoint]) -> CommandAccepted:
        cmd = ctx.command
        await self.platform_session(ctx, cmd.session_id)
        _, result = await self.repo.execute(
            SessionState, cmd.session_id, lambda s: session.save_checkpoint(s, cmd), ctx.meta()
        )
        return accepted(result, checkpoint_id=cmd.checkpoint_id)
