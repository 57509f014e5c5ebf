"""Projects: settings, members, runtime profiles, providers and mount grants."""

from __future__ import annotations

from typing import Any

from suzumio.contracts.commands import (
    ChangeProjectLimits,
    CommandAccepted,
    CreateProject,
    GrantMount,
    RemoveMember,
    RemoveProvider,
    RemoveRuntimeProfile,
    RenameProject,
    RevokeMount,
    SetMember,
    SetProvider,
    SetRuntimeProfile,
)
from suzumio.contracts.errors import ForbiddenError, NotFoundError
from suzumio.contracts.values import Role
from suzumio.platform.bus.commands import CommandContext
from suzumio.session.domain import access, project
from suzumio.session.domain.project import ProjectState
from suzumio.session.domain.user import UserState
from suzumio.session.handlers.base import HandlerGroup, accepted
from suzumio.session.mounts import canonical_mount_path


class ProjectHandlers(HandlerGroup):
    async def create_project(self, ctx: CommandContext[CreateProject]) -> CommandAccepted:
        actor = await self.actor(ctx)
        if actor.user_id is None:
            raise ForbiddenError("a project is created by a user, who becomes its owner")
        cmd = ctx.command
        _, result = await self.repo.execute(
            ProjectState, cmd.project_id, lambda s: project.create(s, cmd, actor.id), ctx.meta()
        )
        return accepted(result, project_id=cmd.project_id)

    async def _admin(
        self, ctx: CommandContext[Any], project_id: str, needed: Role = Role.ADMIN
    ) -> Role:
        actor = await self.actor(ctx)
        _, role = await self.project_role(project_id, actor, needed, "project")
        return role

    async def rename_project(self, ctx: CommandContext[RenameProject]) -> CommandAccepted:
        cmd = ctx.command
        await self._admin(ctx, cmd.project_id)
        _, result = await self.repo.execute(
            ProjectState, cmd.project_id, lambda s: project.rename(s, cmd), ctx.meta()
        )
        return accepted(result, project_id=cmd.project_id)

    async def change_limits(self, ctx: CommandContext[ChangeProjectLimits]) -> CommandAccepted:
        cmd = ctx.command
        await self._admin(ctx, cmd.project_id)
        _, result = await self.repo.execute(
            ProjectState, cmd.project_id, lambda s: project.change_limits(s, cmd), ctx.meta()
        )
        return accepted(result, project_id=cmd.project_id)

    async def set_member(self, ctx: CommandContext[SetMember]) -> CommandAccepted:
        cmd = ctx.command
        role = await self._admin(ctx, cmd.project_id)
        if not (await self.repo.get(UserState, cmd.user_id, fresh=False)).exists:
            raise NotFoundError("user not found")
        _, result = await self.repo.execute(
            ProjectState, cmd.project_id, lambda s: project.set_member(s, cmd, role), ctx.meta()
        )
        return accepted(result, user_id=cmd.user_id, role=cmd.role.value)

    async def remove_member(self, ctx: CommandContext[RemoveMember]) -> CommandAccepted:
        cmd = ctx.command
        actor = await self.actor(ctx)
        state, role = await self.project_role(cmd.project_id, actor, Role.VIEWER, "project")
        if actor.user_id != cmd.user_id:  # leaving needs no rights; removing others does
            access.require(state, actor, Role.ADMIN, "project")
        _, result = await self.repo.execute(
            ProjectState,
            cmd.project_id,
            lambda s: project.remove_member(s, cmd, role),
            ctx.meta(),
        )
        return accepted(result, user_id=cmd.user_id)

    async def set_profile(self, ctx: CommandContext[SetRuntimeProfile]) -> CommandAccepted:
        cmd = ctx.command
        await self._admin(ctx, cmd.project_id)
        _, result = await self.repo.execute(
            ProjectState, cmd.project_id, lambda s: project.set_profile(s, cmd), ctx.meta()
        )
        return accepted(result, name=cmd.name)

    async def remove_profile(self, ctx: CommandContext[RemoveRuntimeProfile]) -> CommandAccepted:
        cmd = ctx.command
        await self._admin(ctx, cmd.project_id)
        _, result = await self.repo.execute(
            ProjectState, cmd.project_id, lambda s: project.remove_profile(s, cmd), ctx.meta()
        )
        return accepted(result, name=cmd.name)

    async def set_provider(self, ctx: CommandContext[SetProvider]) -> CommandAccepted:
        cmd = ctx.command
        await self._admin(ctx, cmd.project_id)
        _, result = await self.repo.execute(
            ProjectState, cmd.project_id, lambda s: project.set_provider(s, cmd), ctx.meta()
        )
        return accepted(result, name=cmd.name)

    async def remove_provider(self, ctx: CommandContext[RemoveProvider]) -> CommandAccepted:
        cmd = ctx.command
        await self._admin(ctx, cmd.project_id)
        _, result = await self.repo.execute(
            ProjectState, cmd.project_id, lambda s: project.remove_provider(s, cmd), ctx.meta()
        )
        return accepted(result, name=cmd.name)

    async def grant_mount(self, ctx: CommandContext[GrantMount]) -> CommandAccepted:
        cmd = ctx.command
        await self._admin(ctx, cmd.project_id)
        host_path = canonical_mount_path(cmd.host_path, self.c.mount_roots)
        _, result = await self.repo.execute(
            ProjectState,
            cmd.project_id,
            lambda s: project.grant_mount(s, cmd, host_path),
            ctx.meta(),
        )
        return accepted(result, grant_id=cmd.grant_id, host_path=host_path)

    async def revoke_mount(self, ctx: CommandContext[RevokeMount]) -> CommandAccepted:
        cmd = ctx.command
        await self._admin(ctx, cmd.project_id)
        _, result = await self.repo.execute(
            ProjectState, cmd.project_id, lambda s: project.revoke_mount(s, cmd), ctx.meta()
        )
        return accepted(result, grant_id=cmd.grant_id)
