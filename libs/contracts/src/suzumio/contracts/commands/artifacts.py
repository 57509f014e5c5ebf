"""Commands about artifacts (the bytes are stored before the command is sent)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from suzumio.contracts.commands.base import Command, command
from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import Clean


@command("session", "record_artifact")
class RecordArtifact(Command):
    project_id: Identifier
    artifact_id: Identifier
    session_id: Identifier | None = None
    path: Clean = Field(min_length=1, max_length=1_000)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)
    content_type: Clean = Field(default="application/octet-stream", max_length=200)
    source: Literal["upload", "activation", "agent_package"] = "upload"
    activation_id: Identifier | None = None


@command("session", "delete_artifact")
class DeleteArtifact(Command):
    artifact_id: Identifier
