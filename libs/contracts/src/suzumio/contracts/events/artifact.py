"""Events of the `artifact` aggregate: stored files, content-addressed by SHA-256."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from suzumio.contracts.envelope import DomainEvent, event
from suzumio.contracts.ids import Identifier


@event("artifact.recorded")
class ArtifactRecorded(DomainEvent):
    """A file now exists: its bytes are the object `sha256/<hex>` of the artifact store."""

    project_id: Identifier
    session_id: Identifier | None = None
    path: str = Field(max_length=1_000, description="relative path, as uploaded or produced")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)
    content_type: str = Field(default="application/octet-stream", max_length=200)
    source: Literal["upload", "activation", "agent_package"] = "upload"
    activation_id: Identifier | None = None


@event("artifact.deleted")
class ArtifactDeleted(DomainEvent):
    pass
