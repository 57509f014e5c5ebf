"""Projects: settings, members, runtime profiles, providers and mount grants.

The actor's role is checked inside each decision, on the same state the append is conditional
on: a role that changed meanwhile makes the append conflict, and the decision (role check
included) is taken again on the latest state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from suzumio.contracts.commands import (
    ChangeProjectLimits,
    CheckProjectRole,
    CommandAccepted,
    CreateProject,
    GrantMount,
    RemoveMember,
    RemoveProvider,
    RemoveRuntimeProfile,
    RenameProject,
    ResealProviderKey,
    RevokeMount,
    SetMember,
    SetProvider,
    SetRuntimeProfile,
)
from suzumio.contracts.envelope import DomainEvent
from suzumio.contracts.errors import ForbiddenError, InvalidError, NotFoundError
from suzumio.contracts.values import Role
from suzumio.platform.bus.commands import CommandContext
from suzumio.session.domain import access, project
from suzumio.session.domain.agent import AgentState
from suzumio.session.domain.project import ProjectState
from suzumio.session.domain.user import UserState
from suzumio.session.handlers.base import HandlerGroup, accepted
from suzumio.session.mounts import canonical_mount_path
from suzumio.session.repository import Outcome

Change = Callable[[ProjectState, Role], Sequence[DomainEvent]]


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

    async def _change(
        self, ctx: CommandContext[Any], project_id: str, change: Change, needed: Role = Role.ADMIN
    ) -> Outcome:
        actor = await self.actor(ctx)

        def decide(state: ProjectState) -> Sequence[DomainEvent]:
            return change(state, access.require(state, actor, needed, "project"))

        _, result = await self.repo.execute(ProjectState, project_id, decide, ctx.meta())
        return result

    async def rename_project(self, ctx: CommandContext[RenameProject]) -> CommandAccepted:
        cmd = ctx.command
        result = await self._change(ctx, cmd.project_id, lambda s, _: project.rename(s, cmd))
        return accepted(result, project_id=cmd.project_id)

    async def change_limits(self, ctx: CommandContext[ChangeProjectLimits]) -> CommandAccepted:
        cmd = ctx.command
        result = await self._change(ctx, cmd.project_id, lambda s, _: project.change_limits(s, cmd))
        return accepted(result, project_id=cmd.project_id)

    async def set_member(self, ctx: CommandContext[SetMember]) -> CommandAccepted:
        cmd = ctx.command
        if not (await self.repo.get(UserState, cmd.user_id)).exists:
            raise NotFoundError("user not found")
        result = await self._change(ctx, cmd.project_id, lambda s, r: project.set_member(s, cmd, r))
        return accepted(result, user_id=cmd.user_id, role=cmd.role.value)

    async def remove_member(self, ctx: CommandContext[RemoveMember]) -> CommandAccepted:
        cmd = ctx.command
        actor = await self.actor(ctx)

        def change(state: ProjectState, role: Role) -> Sequence[DomainEvent]:
            if actor.user_id != cmd.user_id:  # leaving needs no rights; removing others does
                access.require(state, actor, Role.ADMIN, "project")
            return project.remove_member(state, cmd, role)

        result = await self._change(ctx, cmd.project_id, change, Role.VIEWER)
        return accepted(result, user_id=cmd.user_id)

    async def check_role(self, ctx: CommandContext[CheckProjectRole]) -> CommandAccepted:
        if (await self.actor(ctx)).kind != "system":
            raise ForbiddenError("only the platform checks a role against the log")
        cmd = ctx.command
        state = await self.repo.get(ProjectState, cmd.project_id)
        role = state.members.get(cmd.user_id) if state.exists else None
        return CommandAccepted(result={"role": role.value if role else None})

    async def set_profile(self, ctx: CommandContext[SetRuntimeProfile]) -> CommandAccepted:
        cmd = ctx.command
        result = await self._change(ctx, cmd.project_id, lambda s, _: project.set_profile(s, cmd))
        return accepted(result, name=cmd.name)

    async def remove_profile(self, ctx: CommandContext[RemoveRuntimeProfile]) -> CommandAccepted:
        cmd = ctx.command
        result = await self._change(
            ctx, cmd.project_id, lambda s, _: project.remove_profile(s, cmd)
        )
        return accepted(result, name=cmd.name)

    async def set_provider(self, ctx: CommandContext[SetProvider]) -> CommandAccepted:
        cmd = ctx.command
        result = await self._change(ctx, cmd.project_id, lambda s, _: project.set_provider(s, cmd))
        return accepted(result, name=cmd.name)

    async def reseal_provider_key(self, ctx: CommandContext[ResealProviderKey]) -> CommandAccepted:
        cmd = ctx.command
        result = await self._change(
            ctx, cmd.project_id, lambda s, _: project.reseal_provider_key(s, cmd)
        )
        return accepted(result, name=cmd.name)

    async def remove_provider(self, ctx: CommandContext[RemoveProvider]) -> CommandAccepted:
        cmd = ctx.command
        result = await self._change(
            ctx, cmd.project_id, lambda s, _: project.remove_provider(s, cmd)
        )
        return accepted(result, name=cmd.name)

    async def grant_mount(self, ctx: CommandContext[GrantMount]) -> CommandAccepted:
        cmd = ctx.command
        state = await self.repo.get(ProjectState, cmd.project_id)
        access.require(state, await self.actor(ctx), Role.ADMIN, "project")
        if cmd.agent_id is not None:
            agent = await self.repo.get(AgentState, cmd.agent_id)
            if agent.project_id != cmd.project_id:
                raise InvalidError("the agent is not one of this project's")
        host_path = canonical_mount_path(cmd.host_path, self.c.mount_roots, self.c.reserved_dirs)
        result = await self._change(
            ctx, cmd.project_id, lambda s, _: project.grant_mount(s, cmd, host_path)
        )
        return accepted(result, grant_id=cmd.grant_id, host_path=host_path)

    async def revoke_mount(self, ctx: CommandContext[RevokeMount]) -> CommandAccepted:
        cmd = ctx.command
        result = await self._change(ctx, cmd.project_id, lambda s, _: project.revoke_mount(s, cmd))
        return accepted(result, grant_id=cmd.grant_id)
