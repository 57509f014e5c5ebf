"""Commands owned by the session service (the aggregates' single writer)."""

from __future__ import annotations

from pydantic import Field

from suzumio.contracts.commands.base import Command, command
from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import ModelSpec, Name, Priority, ProjectLimits, Text


@command("session", "create_project")
class CreateProject(Command):
    name: Name
    limits: ProjectLimits = ProjectLimits()


@command("session", "rename_project")
class RenameProject(Command):
    project_id: Identifier
    name: Name


@command("session", "change_project_limits")
class ChangeProjectLimits(Command):
    project_id: Identifier
    limits: ProjectLimits


@command("session", "create_agent")
class CreateAgent(Command):
    project_id: Identifier
    name: Name
    role: Name
    prompt: Text = ""
    model: ModelSpec
    fallbacks: tuple[ModelSpec, ...] = ()
    tools: tuple[str, ...] = ()
    toolpacks: tuple[str, ...] = ()
    runtime_profile: str | None = None


@command("session", "update_agent")
class UpdateAgent(Command):
    agent_id: Identifier
    name: Name | None = None
    role: Name | None = None
    prompt: Text | None = None
    model: ModelSpec | None = None
    fallbacks: tuple[ModelSpec, ...] | None = None
    tools: tuple[str, ...] | None = None
    toolpacks: tuple[str, ...] | None = None
    runtime_profile: str | None = None


@command("session", "disable_agent")
class DisableAgent(Command):
    agent_id: Identifier
    reason: str = Field(default="", max_length=2_000)


@command("session", "open_session")
class OpenSession(Command):
    agent_id: Identifier
    title: str = Field(default="", max_length=500)


@command("session", "close_session")
class CloseSession(Command):
    session_id: Identifier
    reason: str = Field(default="", max_length=2_000)


@command("session", "reopen_session")
class ReopenSession(Command):
    session_id: Identifier


@command("session", "post_message")
class PostMessage(Command):
    """A user's message to the session's agent; records a signal for it (DESIGN.md §6)."""

    session_id: Identifier
    text: Text = Field(min_length=1)
    priority: Priority | None = Field(
        default=None, description="defaults to P1 for a user's message"
    )
