"""`proj_artifacts.artifacts`: stored files, by project and session."""

from __future__ import annotations

from typing import ClassVar

from suzumio.contracts.events import ArtifactDeleted, ArtifactRecorded
from suzumio.platform.db.pool import Connection
from suzumio.platform.projections.base import Events, Projection
from suzumio.platform.projections.writes import RowChanges


class ArtifactsProjection(Projection):
    name: ClassVar[str] = "artifacts"
    version: ClassVar[int] = 1
    handles: ClassVar[frozenset[str]] = frozenset(
        c.event_type for c in (ArtifactRecorded, ArtifactDeleted)
    )
    tables: ClassVar[tuple[str, ...]] = ("artifacts",)

    def ddl(self, schema: str) -> str:
        return f"""
        CREATE TABLE {schema}.artifacts (
            id text PRIMARY KEY,
            project_id text NOT NULL,
            session_id text,
            activation_id text,
            path text NOT NULL,
            sha256 text NOT NULL,
            size bigint NOT NULL,
            content_type text NOT NULL,
            source text NOT NULL,
            created_at timestamptz NOT NULL,
            deleted_at timestamptz,
            position bigint NOT NULL
        );
        CREATE INDEX ON {schema}.artifacts (project_id, created_at);
        CREATE INDEX ON {schema}.artifacts (session_id, created_at);
        CREATE INDEX ON {schema}.artifacts (sha256);
        """

    async def apply(self, conn: Connection, schema: str, events: Events) -> None:
        rows = RowChanges(f"{schema}.artifacts", "id")
        for e in events:
            match e.data:
                case ArtifactRecorded() as d:
                    rows.insert(
                        e.aggregate_id,
                        **d.model_dump(mode="json"),
                        created_at=e.occurred_at,
                        deleted_at=None,
                        position=e.seq,
                    )
                case ArtifactDeleted():
                    rows.set(e.aggregate_id, deleted_at=e.occurred_at, position=e.seq)
        await rows.flush(conn)
