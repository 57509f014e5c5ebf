"""Artifacts (their bytes are in the object store before the command arrives)."""

from __future__ import annotations

from suzumio.contracts.commands import CommandAccepted, DeleteArtifact, RecordArtifact
from suzumio.contracts.errors import InvalidError, NotFoundError
from suzumio.contracts.values import Role
from suzumio.platform.bus.commands import CommandContext
from suzumio.session.domain import artifact
from suzumio.session.domain.artifact import ArtifactState
from suzumio.session.domain.session import SessionState
from suzumio.session.handlers.base import HandlerGroup, accepted


class ArtifactHandlers(HandlerGroup):
    async def record_artifact(self, ctx: CommandContext[RecordArtifact]) -> CommandAccepted:
        cmd = ctx.command
        await self.project_role(cmd.project_id, await self.actor(ctx), Role.MEMBER, "project")
        if cmd.session_id is not None:
            owner = await self.repo.get(SessionState, cmd.session_id)
            if not owner.exists or owner.project_id != cmd.project_id:
                raise InvalidError("the session is not one of this project's")
        _, result = await self.repo.execute(
            ArtifactState, cmd.artifact_id, lambda s: artifact.record(s, cmd), ctx.meta()
        )
        return accepted(result, artifact_id=cmd.artifact_id)

    async def delete_artifact(self, ctx: CommandContext[DeleteArtifact]) -> CommandAccepted:
        cmd = ctx.command
        state = await self.repo.get(ArtifactState, cmd.artifact_id)
        if not state.exists or state.deleted:
            raise NotFoundError("artifact not found")
        await self.project_role(state.project_id, await self.actor(ctx), Role.MEMBER, "artifact")
        _, result = await self.repo.execute(
            ArtifactState, cmd.artifact_id, lambda s: artifact.delete(s, cmd), ctx.meta()
        )
        return accepted(result, artifact_id=cmd.artifact_id)
