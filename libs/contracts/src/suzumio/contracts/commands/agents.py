"""Commands about agents."""

from __future__ import annotations

from pydantic import Field, model_validator

from suzumio.contracts.commands.base import Command, command
from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import (
    MAX_ENV_FACTS,
    MAX_PERMISSIONS,
    AssetRef,
    Clean,
    FactText,
    ModelSpec,
    Name,
    Slug,
    Text,
    ToolPolicy,
    ToolRef,
    WorkspaceMode,
)


@command("session", "create_agent")
class CreateAgent(Command):
    project_id: Identifier
    agent_id: Identifier
    name: Name
    role: Name
    prompt: Text = ""
    model: ModelSpec
    fallbacks: tuple[ModelSpec, ...] = Field(default=(), max_length=16)
    tools: tuple[ToolRef, ...] = Field(default=(), max_length=200)
    toolpacks: tuple[ToolRef, ...] = Field(default=(), max_length=100)
    runtime_profile: Slug | None = None
    description: Clean = Field(default="", max_length=10_000)
    permissions: dict[ToolRef, ToolPolicy] = Field(default_factory=dict, max_length=MAX_PERMISSIONS)
    env_facts: dict[FactText, FactText] = Field(default_factory=dict, max_length=MAX_ENV_FACTS)
    workspace_mode: WorkspaceMode = WorkspaceMode.COPY
    assets: tuple[AssetRef, ...] = Field(default=(), max_length=10_000)


@command("session", "update_agent")
class UpdateAgent(Command):
    """Fields left out (None) stay as they are."""

    agent_id: Identifier
    name: Name | None = None
    role: Name | None = None
    prompt: Text | None = None
    model: ModelSpec | None = None
    fallbacks: tuple[ModelSpec, ...] | None = Field(default=None, max_length=16)
    tools: tuple[ToolRef, ...] | None = Field(default=None, max_length=200)
    toolpacks: tuple[ToolRef, ...] | None = Field(default=None, max_length=100)
    runtime_profile: Slug | None = None
    description: Clean | None = Field(default=None, max_length=10_000)
    permissions: dict[ToolRef, ToolPolicy] | None = Field(default=None, max_length=MAX_PERMISSIONS)
    env_facts: dict[FactText, FactText] | None = Field(default=None, max_length=MAX_ENV_FACTS)
    workspace_mode: WorkspaceMode | None = None
    assets: tuple[AssetRef, ...] | None = Field(default=None, max_length=10_000)
    clear_runtime_profile: bool = False  # `None` above leaves it as it is

    @model_validator(mode="after")
    def _one_profile(self) -> UpdateAgent:
        if self.clear_runtime_profile and self.runtime_profile is not None:
            raise ValueError("either a runtime profile or clear_runtime_profile, not both")
        return self


@command("session", "disable_agent")
class DisableAgent(Command):
    agent_id: Identifier
    reason: Clean = Field(default="", max_length=2_000)


@command("session", "enable_agent")
class EnableAgent(Command):
    agent_id: Identifier
