"""What every command handler needs: the repository, the actor, and the reply."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from suzumio.contracts.commands import CommandAccepted
from suzumio.contracts.errors import CommandError, ForbiddenError
from suzumio.contracts.values import Role
from suzumio.platform.bus.commands import CommandContext
from suzumio.session.domain import access
from suzumio.session.domain.access import Actor
from suzumio.session.domain.project import ProjectState
from suzumio.session.domain.user import UserState
from suzumio.session.repository import Outcome, Repository


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class Context:
    """Shared by the handler groups: where state lives and what the host allows."""

    repo: Repository
    mount_roots: tuple[Path, ...] = ()
    clock: Callable[[], datetime] = utcnow
    on_pending_action: Callable[[str, datetime], None] = field(default=lambda _, __: None)
    reserved_dirs: tuple[Path, ...] = ()  # no mount grant may overlap these


class HandlerGroup:
    def __init__(self, context: Context) -> None:
        self.c = context
        self.repo = context.repo

    async def actor(self, ctx: CommandContext[Any]) -> Actor:
        actor = Actor.parse(ctx.actor)
        if actor.kind == "user":
            user = await self.repo.get(UserState, actor.id, fresh=False)
            if not user.exists:
                raise ForbiddenError("unknown user")
            return Actor(actor.kind, actor.id, admin=user.admin)
        if actor.kind != "system":
            raise ForbiddenError(f"{actor.kind} actors may not send this command")
        return actor

    async def project_role(
        self, project_id: str, actor: Actor, needed: Role, what: str
    ) -> tuple[ProjectState, Role]:
        project = await self.repo.get(ProjectState, project_id)
        try:
            return project, access.require(project, actor, needed, what)
        except CommandError:
            # Refused on a read a replica behind may have answered (a member added a moment
            # ago): once more from one that holds every acknowledged write.
            project = await self.repo.latest(ProjectState, project_id)
            return project, access.require(project, actor, needed, what)


def accepted(result: Outcome, **extra: Any) -> CommandAccepted:
    return CommandAccepted(events=result.events, position=result.seq, result=extra)
