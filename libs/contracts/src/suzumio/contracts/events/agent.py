"""Events of the `agent` aggregate: a configured role in a project."""

from __future__ import annotations

from pydantic import Field

from suzumio.contracts.envelope import DomainEvent, event
from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import (
    AssetRef,
    ModelSpec,
    Name,
    Slug,
    Text,
    ToolPolicy,
    WorkspaceMode,
)


@event("agent.created")
class AgentCreated(DomainEvent):
    project_id: Identifier
    name: Name
    role: Name
    prompt: Text
    model: ModelSpec
    fallbacks: tuple[ModelSpec, ...] = ()
    tools: tuple[str, ...] = ()
    toolpacks: tuple[str, ...] = ()
    runtime_profile: Slug | None = None
    description: str = ""
    permissions: dict[str, ToolPolicy] = Field(default_factory=dict)
    env_facts: dict[str, str] = Field(default_factory=dict)
    workspace_mode: WorkspaceMode = WorkspaceMode.COPY
    assets: tuple[AssetRef, ...] = ()


@event("agent.updated")
class AgentUpdated(DomainEvent):
    """Only the fields that changed are set; `None` means unchanged."""

    name: Name | None = None
    role: Name | None = None
    prompt: Text | None = None
    model: ModelSpec | None = None
    fallbacks: tuple[ModelSpec, ...] | None = None
    tools: tuple[str, ...] | None = None
    toolpacks: tuple[str, ...] | None = None
    runtime_profile: Slug | None = None
    description: str | None = None
    permissions: dict[str, ToolPolicy] | None = None
    env_facts: dict[str, str] | None = None
    workspace_mode: WorkspaceMode | None = None
    assets: tuple[AssetRef, ...] | None = None
    runtime_profile_cleared: bool = False  # back to none: the platform's default backend


@event("agent.disabled")
class AgentDisabled(DomainEvent):
    reason: str = Field(default="", max_length=2_000)


@event("agent.enabled")
class AgentEnabled(DomainEvent):
    pass
