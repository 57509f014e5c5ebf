"""Commands about agents."""

from __future__ import annotations

from pydantic import Field

from suzumio.contracts.commands.base import Command, command
from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import (
    AssetRef,
    Clean,
    ModelSpec,
    Name,
    Slug,
    Text,
    ToolPolicy,
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
    tools: tuple[Clean, ...] = Field(default=(), max_length=200)
    toolpacks: tuple[Clean, ...] = Field(default=(), max_length=100)
    runtime_profile: Slug | None = None
    description: Clean = Field(default="", max_length=10_000)
    permissions: dict[str, ToolPolicy] = Field(default_factory=dict)
    env_facts: dict[Clean, Clean] = Field(default_factory=dict)
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
    fallbacks: tuple[ModelSpec, ...] | None = None
    tools: tuple[Clean, ...] | None = None
    toolpacks: tuple[Clean, ...] | None = None
    runtime_profile: Slug | None = None
    description: Clean | None = Field(default=None, max_length=10_000)
    permissions: dict[str, ToolPolicy] | None = None
    env_facts: dict[Clean, Clean] | None = None
    workspace_mode: WorkspaceMode | None = None
    assets: tuple[AssetRef, ...] | None = None


@command("session", "disable_agent")
class DisableAgent(Command):
    agent_id: Identifier
    reason: Clean = Field(default="", max_length=2_000)


@command("session", "enable_agent")
class EnableAgent(Command):
    agent_id: Identifier
