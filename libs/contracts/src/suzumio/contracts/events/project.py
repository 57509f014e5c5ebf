"""Events of the `project` aggregate: a tenant's space."""

from __future__ import annotations

from pydantic import Field

from suzumio.contracts.envelope import DomainEvent, event
from suzumio.contracts.values import Name, ProjectLimits


@event("project.created")
class ProjectCreated(DomainEvent):
    name: Name
    owner_id: str = Field(description="user id of the creator, the project's first owner")
    limits: ProjectLimits = ProjectLimits()


@event("project.renamed")
class ProjectRenamed(DomainEvent):
    name: Name


@event("project.limits_changed")
class ProjectLimitsChanged(DomainEvent):
    limits: ProjectLimits
