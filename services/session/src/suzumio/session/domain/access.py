"""Who may do what: actors, project roles, and the errors that say no.

An object of a project the actor cannot see does not exist for them: the error is the same
`not_found` a missing object gives. Seeing but not being allowed to change is `forbidden`.
"""

from __future__ import annotations

from dataclasses import dataclass

from suzumio.contracts.errors import ForbiddenError, NotFoundError
from suzumio.contracts.values import Role
from suzumio.session.domain.project import ProjectState


@dataclass(frozen=True)
class Actor:
    """Who sent a command: a user (maybe a platform admin) or a platform service."""

    kind: str  # "user", "system" or "agent"
    id: str
    admin: bool = False

    @staticmethod
    def parse(actor: str, *, admin: bool = False) -> Actor:
        kind, _, ident = actor.partition(":")
        return Actor(kind or "unknown", ident, admin)

    @property
    def trusted(self) -> bool:
        """Platform services act on behalf of the platform, across projects."""
        return self.kind == "system" or self.admin

    @property
    def user_id(self) -> str | None:
        return self.id if self.kind == "user" else None


def role_in(project: ProjectState, actor: Actor) -> Role | None:
    if not project.exists:
        return None
    if actor.trusted:
        return Role.OWNER
    return project.members.get(actor.user_id or "")


def require(project: ProjectState, actor: Actor, needed: Role, what: str) -> Role:
    """The actor's role, if at least `needed`; else not_found (cannot see) or forbidden."""
    role = role_in(project, actor)
    if role is None:
        raise NotFoundError(f"{what} not found")
    if not role.at_least(needed):
        raise ForbiddenError(f"a {needed.value} of the project may do this; you are {role.value}")
    return role
