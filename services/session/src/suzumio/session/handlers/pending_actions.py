"""Pending actions: created for a runner's question, answered by a person, or expired.
Either outcome records a P1 signal so the session's agent learns of it."""

from __future__ import annotations

from suzumio.contracts.commands import (
    AnswerPendingAction,
    CommandAccepted,
    CreatePendingAction,
    ExpirePendingAction,
)
from suzumio.contracts.envelope import DomainEvent, EventMeta
from suzumio.contracts.errors import ForbiddenError, NotFoundError
from suzumio.contracts.values import Role
from suzumio.platform.bus.commands import CommandContext
from suzumio.platform.bus.eventstore import AppendResult
from suzumio.session.domain import pending_action
from suzumio.session.domain.pending_action import PendingActionState
from suzumio.session.domain.session import SessionState
from suzumio.session.handlers.base import HandlerGroup, accepted


class PendingActionHandlers(HandlerGroup):
    async def create(self, ctx: CommandContext[CreatePendingAction]) -> CommandAccepted:
        cmd = ctx.command
        actor = await self.actor(ctx)
        if not actor.trusted:
            raise ForbiddenError("pending actions are created by the platform for a runner")
        owner = await self.repo.get(SessionState, cmd.session_id)
        if not owner.exists:
            raise NotFoundError("session not found")
        now = self.c.clock()
        state, result = await self.repo.execute(
            PendingActionState,
            cmd.pending_action_id,
            lambda s: pending_action.create(s, owner, cmd, now),
            ctx.meta(),
        )
        self.c.on_pending_action(state.expires_at)
        return accepted(
            result, pending_action_id=cmd.pending_action_id, expires_at=state.expires_at.isoformat()
        )

    async def answer(self, ctx: CommandContext[AnswerPendingAction]) -> CommandAccepted:
        cmd = ctx.command
        actor = await self.actor(ctx)
        state = await self.repo.get(PendingActionState, cmd.pending_action_id)
        if not state.exists:
            raise NotFoundError("pending action not found")
        await self.project_role(state.project_id, actor, Role.MEMBER, "pending action")
        now = self.c.clock()
        state, result = await self.repo.execute(
            PendingActionState,
            cmd.pending_action_id,
            lambda s: pending_action.answer(s, cmd, f"{actor.kind}:{actor.id}", now),
            ctx.meta(),
        )
        return await self._resumed(state, result, cmd.signal_id, ctx.meta())

    async def expire(self, ctx: CommandContext[ExpirePendingAction]) -> CommandAccepted:
        cmd = ctx.command
        if not (await self.actor(ctx)).trusted:
            raise ForbiddenError("pending actions expire by the platform's clock")
        now = self.c.clock()
        state, result = await self.repo.execute(
            PendingActionState,
            cmd.pending_action_id,
            lambda s: pending_action.expire(s, cmd, now),
            ctx.meta(),
        )
        return await self._resumed(state, result, cmd.signal_id, ctx.meta())

    async def _resumed(
        self,
        state: PendingActionState,
        result: AppendResult | None,
        signal_id: str,
        meta: EventMeta,
    ) -> CommandAccepted:
        """Tell the agent: a P1 signal on the session, unless closed or already recorded."""
        if result is None:
            return accepted(None, pending_action_id=state.id, status=state.status)
        stream = await self.repo.store.load("pending_action", state.id)
        outcome: DomainEvent = stream.events[-1].data

        def decide(s: SessionState) -> list[DomainEvent]:
            if s.closed or signal_id in s.signals:
                return []
            return [pending_action.resume_signal(state, s, signal_id, outcome)]

        _, signal = await self.repo.execute(SessionState, state.session_id, decide, meta)
        position = max(result.seq, signal.seq if signal else 0)
        reply = accepted(
            result,
            pending_action_id=state.id,
            status=state.status,
            signal_id=signal_id if signal else None,
        )
        return reply.model_copy(update={"position": position})
