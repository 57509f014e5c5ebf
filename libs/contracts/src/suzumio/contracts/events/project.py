"""Events of the `project` aggregate: a tenant's space."""

from __future__ import annotations

from pydantic import Field

from suzumio.contracts.envelope import DomainEvent, event
from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import (
    MountMode,
    Name,
    ProjectLimits,
    ProviderSpec,
    Role,
    RuntimeProfileSpec,
    Slug,
)


@event("project.created")
class ProjectCreated(DomainEvent):
    """The creator becomes the project's first owner."""

    name: Name
    owner_id: str = Field(description="user id of the creator, the project's first owner")
    limits: ProjectLimits = ProjectLimits()


@event("project.renamed")
class ProjectRenamed(DomainEvent):
    name: Name


@event("project.limits_changed")
class ProjectLimitsChanged(DomainEvent):
    limits: ProjectLimits


@event("project.member_added")
class MemberAdded(DomainEvent):
    user_id: Identifier
    role: Role


@event("project.member_role_changed")
class MemberRoleChanged(DomainEvent):
    user_id: Identifier
    role: Role


@event("project.member_removed")
class MemberRemoved(DomainEvent):
    user_id: Identifier


@event("project.runtime_profile_set")
class RuntimeProfileSet(DomainEvent):
    """Creates or replaces the project's runtime profile `name`."""

    name: Slug
    spec: RuntimeProfileSpec


@event("project.runtime_profile_removed")
class RuntimeProfileRemoved(DomainEvent):
    name: Slug


@event("project.provider_set")
class ProviderSet(DomainEvent):
    """Creates or replaces the provider settings `name`; the key, if any, is sealed."""

    name: Slug
    spec: ProviderSpec


@event("project.provider_removed")
class ProviderRemoved(DomainEvent):
    name: Slug


@event("project.mount_granted")
class MountGranted(DomainEvent):
    """Permission to mount a host directory (canonical path) into sandboxes of the project,
    or of one agent of it."""

    grant_id: Identifier
    host_path: str
    target: str
    mode: MountMode
    agent_id: Identifier | None = None


@event("project.mount_revoked")
class MountRevoked(DomainEvent):
    grant_id: Identifier
