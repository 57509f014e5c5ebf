"""Users and API keys."""

from __future__ import annotations

from suzumio.contracts.commands import (
    BootstrapAdmin,
    CheckApiKey,
    CommandAccepted,
    CreateApiKey,
    CreateUser,
    RevokeApiKey,
)
from suzumio.contracts.errors import ForbiddenError, NotFoundError
from suzumio.platform.bus.commands import CommandContext
from suzumio.session.domain import user
from suzumio.session.domain.access import Actor
from suzumio.session.domain.user import BOOTSTRAP_ADMIN_ID, UserState
from suzumio.session.handlers.base import HandlerGroup, accepted


class UserHandlers(HandlerGroup):
    async def bootstrap_admin(self, ctx: CommandContext[BootstrapAdmin]) -> CommandAccepted:
        if Actor.parse(ctx.actor).kind != "system":
            raise ForbiddenError("only the platform bootstraps its first admin")
        _, result = await self.repo.execute(
            UserState, BOOTSTRAP_ADMIN_ID, lambda s: user.bootstrap(s, ctx.command), ctx.meta()
        )
        return accepted(result, user_id=BOOTSTRAP_ADMIN_ID)

    async def create_user(self, ctx: CommandContext[CreateUser]) -> CommandAccepted:
        actor = await self.actor(ctx)
        if not actor.trusted:
            raise ForbiddenError("only a platform admin creates users")
        cmd = ctx.command
        _, result = await self.repo.execute(
            UserState, cmd.user_id, lambda s: user.create(s, cmd), ctx.meta()
        )
        return accepted(result, user_id=cmd.user_id)

    async def _own_user(
        self, ctx: CommandContext[CreateApiKey] | CommandContext[RevokeApiKey], user_id: str
    ) -> None:
        actor = await self.actor(ctx)
        if not actor.trusted and actor.user_id != user_id:
            raise NotFoundError("user not found")
        if not (await self.repo.get(UserState, user_id)).exists:
            raise NotFoundError("user not found")

    async def create_api_key(self, ctx: CommandContext[CreateApiKey]) -> CommandAccepted:
        cmd = ctx.command
        await self._own_user(ctx, cmd.user_id)
        now = self.c.clock()
        _, result = await self.repo.execute(
            UserState, cmd.user_id, lambda s: user.create_key(s, cmd, now), ctx.meta()
        )
        return accepted(result, key_id=cmd.key_id)

    async def revoke_api_key(self, ctx: CommandContext[RevokeApiKey]) -> CommandAccepted:
        cmd = ctx.command
        await self._own_user(ctx, cmd.user_id)
        _, result = await self.repo.execute(
            UserState, cmd.user_id, lambda s: user.revoke_key(s, cmd), ctx.meta()
        )
        return accepted(result, key_id=cmd.key_id)

    async def check_api_key(self, ctx: CommandContext[CheckApiKey]) -> CommandAccepted:
        if Actor.parse(ctx.actor).kind != "system":
            raise ForbiddenError("only the platform checks a key against the log")
        cmd = ctx.command
        state = await self.repo.get(UserState, cmd.user_id)
        ok = state.exists and user.usable(state, cmd.key_id, self.c.clock())
        return CommandAccepted(result={"usable": ok, "admin": ok and state.admin})
