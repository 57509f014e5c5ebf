"""Pending actions: created for a runner's question, answered by a person, or expired.
Either outcome records a P1 signal so the session's agent learns of it."""

from __future__ import annotations

from collections.abc import Sequence

from suzumio.contracts.commands import (
    AnswerPendingAction,
    CommandAccepted,
    CreatePendingAction,
    ExpirePendingAction,
)
from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.errors import ConflictError, ForbiddenError, InvalidError, NotFoundError
from suzumio.contracts.values import Role
from suzumio.platform.bus.commands import CommandContext
from suzumio.platform.logging import get_logger
from suzumio.session.domain import pending_action
from suzumio.session.domain.artifact import ArtifactState
from suzumio.session.domain.pending_action import PendingActionState
from suzumio.session.domain.session import SessionState
from suzumio.session.handlers.base import HandlerGroup, accepted
from suzumio.session.repository import Outcome, Repository

log = get_logger(__name__)


class PendingActionHandlers(HandlerGroup):
    async def create(self, ctx: CommandContext[CreatePendingAction]) -> CommandAccepted:
        cmd = ctx.command
        actor = await self.actor(ctx)
        if not actor.trusted:
            raise ForbiddenError("pending actions are created by the platform for a runner")
        owner = await self.repo.get(SessionState, cmd.session_id)
        if not owner.exists:
            owner = await self.repo.latest(SessionState, cmd.session_id)
            if not owner.exists:
                raise NotFoundError("session not found")
        now = self.c.clock()
        try:
            _, result = await self.repo.execute(
                PendingActionState,
                cmd.pending_action_id,
                lambda s: pending_action.create(s, owner, cmd, now),
                ctx.meta(),
            )
        except ConflictError:
            # Asked before — maybe by this very request, whose check below then failed (two
            # appends, a NATS blink between them): the broker takes the conflict for its
            # retry's success, so the check is made again now, or never.
            asked = await self.repo.get(PendingActionState, cmd.pending_action_id)
            if asked.exists and asked.session_id == cmd.session_id:
                await self._unless_fenced(cmd, ctx)
            raise
        state = await self._unless_fenced(cmd, ctx)
        return accepted(
            result,
            pending_action_id=cmd.pending_action_id,
            expires_at=state.expires_at.isoformat(),
            status=state.status,
        )

    async def _unless_fenced(
        self, cmd: CreatePendingAction, ctx: CommandContext[CreatePendingAction]
    ) -> PendingActionState:
        """The action, cancelled if its activation is fenced on the session as it is now (a
        cancel stored after the create's read); else its expiry is due."""
        now_owner = await self.repo.get(SessionState, cmd.session_id)
        state, fenced = await self.repo.execute(
            PendingActionState,
            cmd.pending_action_id,
            lambda s: pending_action.cancel_if_fenced(s, now_owner),
            ctx.meta(),
        )
        if not fenced.events and state.status == "open":
            self.c.on_pending_action(cmd.pending_action_id, state.expires_at)
        return state

    async def answer(self, ctx: CommandContext[AnswerPendingAction]) -> CommandAccepted:
        cmd = ctx.command
        actor = await self.actor(ctx)
        state = await self.repo.get(PendingActionState, cmd.pending_action_id)
        if not state.exists:
            state = await self.repo.latest(PendingActionState, cmd.pending_action_id)
            if not state.exists:
                raise NotFoundError("pending action not found")
        await self.project_role(state.project_id, actor, Role.MEMBER, "pending action")
        await self._check_artifacts(state, cmd.artifact_ids)
        owner = await self.repo.get(SessionState, state.session_id)
        if owner.closed and (await self.repo.latest(SessionState, state.session_id)).closed:
            # A closed session starts nothing: the answer would wait, unseen, for a reopen
            # (its signal is recorded and held). Said now, while the person is here.
            raise ConflictError("the session is closed: reopen it to answer")
        now = self.c.clock()
        state, result = await self.repo.execute(
            PendingActionState,
            cmd.pending_action_id,
            lambda s: pending_action.answer(s, cmd, f"{actor.kind}:{actor.id}", now),
            ctx.meta(),
        )
        return await self._resumed(state, result, ctx.meta())

    async def expire(self, ctx: CommandContext[ExpirePendingAction]) -> CommandAccepted:
        cmd = ctx.command
        if not (await self.actor(ctx)).trusted:
            raise ForbiddenError("pending actions expire by the platform's clock")
        now = self.c.clock()
        state = await self.repo.get(PendingActionState, cmd.pending_action_id)
        session = await self.repo.get(SessionState, state.session_id) if state.exists else None
        state, result = await self.repo.execute(
            PendingActionState,
            cmd.pending_action_id,
            lambda s: pending_action.expire(s, session or SessionState(""), cmd, now),
            ctx.meta(),
        )
        return await self._resumed(state, result, ctx.meta())

    async def _check_artifacts(
        self, state: PendingActionState, artifact_ids: Sequence[str]
    ) -> None:
        """Handed-over files must be live artifacts of the action's own project: an id from
        another project would let its bytes leak into this session."""
        for artifact_id in dict.fromkeys(artifact_ids):
            artifact = await self.repo.get(ArtifactState, artifact_id)
            if not artifact.exists or artifact.deleted or artifact.project_id != state.project_id:
                raise InvalidError(f"artifact {artifact_id} is not an artifact of this project")

    async def _resumed(
        self, state: PendingActionState, result: Outcome, meta: EventMeta
    ) -> CommandAccepted:
        if not result.events:  # answered or expired already: nothing new to tell the agent
            return accepted(result, pending_action_id=state.id, status=state.status)
        try:
            signal = await record_resume_signal(self.repo, state, meta)
        except Exception:
            # The outcome is in the log: refusing now would make the caller's retry a 409
            # ("answered already") for a request that succeeded. The catch-up reaction on
            # the outcome records the signal (its id is derived, so it is recorded once).
            log.exception("pending_action.resume_signal_deferred", pending_action=state.id)
            signal = None
        reply = accepted(
            result,
            pending_action_id=state.id,
            status=state.status,
            signal_id=pending_action.resume_signal_id(state.id)
            if signal and signal.events
            else None,
        )
        return reply.model_copy(update={"position": max(result.seq, signal.seq if signal else 0)})


async def record_resume_signal(
    repo: Repository, state: PendingActionState, meta: EventMeta
) -> Outcome | None:
    """Tell the session's agent how its pending action ended: a P1 signal, recorded once
    (its id is derived), on a closed session too (held until a reopen). Called right after
    the outcome is appended, and again by the catch-up reaction in case this process died in
    between."""
    stream = await repo.store.load("pending_action", state.id)
    outcome = next(
        (e.data for e in reversed(stream.events) if e.type in pending_action.OUTCOMES), None
    )
    if outcome is None:
        return None
    _, signal = await repo.execute(
        SessionState,
        state.session_id,
        lambda s: pending_action.resume_signal(state, s, outcome),
        meta,
    )
    return signal
