"""The artifact aggregate: a stored file of a project (and maybe of one of its sessions)."""

from __future__ import annotations

import posixpath
from typing import ClassVar

from suzumio.contracts.commands import DeleteArtifact, RecordArtifact
from suzumio.contracts.envelope import DomainEvent
from suzumio.contracts.errors import InvalidError, NotFoundError, id_taken
from suzumio.contracts.events import ArtifactDeleted, ArtifactRecorded
from suzumio.session.domain.state import AggregateState


class ArtifactState(AggregateState):
    aggregate: ClassVar[str] = "artifact"

    def __init__(self, aggregate_id: str) -> None:
        super().__init__(aggregate_id)
        self.project_id = ""
        self.session_id: str | None = None
        self.deleted = False

    def apply(self, data: DomainEvent) -> None:
        match data:
            case ArtifactRecorded():
                self.project_id, self.session_id = data.project_id, data.session_id
            case ArtifactDeleted():
                self.deleted = True


def relative_path(path: str) -> str:
    """A safe relative path (`a/b.txt`): no absolute paths, no `..`, no empty parts."""
    if path.startswith("/") or "\\" in path or "\x00" in path:
        raise InvalidError(f"artifact path {path!r} must be relative, with '/' separators")
    norm = posixpath.normpath(path)
    if norm in {".", ""} or norm.startswith("../") or norm == "..":
        raise InvalidError(f"artifact path {path!r} leaves its folder")
    return norm


def record(state: ArtifactState, cmd: RecordArtifact) -> list[DomainEvent]:
    if state.exists:
        raise id_taken("an artifact")
    return [
        ArtifactRecorded(
            **cmd.model_dump(exclude={"artifact_id", "path"}), path=relative_path(cmd.path)
        )
    ]


def delete(state: ArtifactState, _: DeleteArtifact) -> list[DomainEvent]:
    if state.deleted:
        raise NotFoundError("artifact not found")
    return [ArtifactDeleted()]
