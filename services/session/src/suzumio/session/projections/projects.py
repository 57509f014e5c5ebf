"""`proj_projects.projects`: one row per project."""

from __future__ import annotations

from typing import ClassVar

from suzumio.contracts.events import ProjectCreated, ProjectLimitsChanged, ProjectRenamed
from suzumio.platform.db.pool import Connection
from suzumio.platform.projections.base import Events, Projection
from suzumio.platform.projections.writes import RowChanges


class ProjectsProjection(Projection):
    name: ClassVar[str] = "projects"
    version: ClassVar[int] = 1
    handles: ClassVar[frozenset[str]] = frozenset(
        {ProjectCreated.event_type, ProjectRenamed.event_type, ProjectLimitsChanged.event_type}
    )
    tables: ClassVar[tuple[str, ...]] = ("projects",)

    def ddl(self, schema: str) -> str:
        return f"""
        CREATE TABLE {schema}.projects (
            id text PRIMARY KEY,
            name text NOT NULL,
            owner_id text NOT NULL,
            max_concurrent_activations integer NOT NULL,
            created_at timestamptz NOT NULL,
            updated_at timestamptz NOT NULL,
            version integer NOT NULL,
            position bigint NOT NULL
        );
        CREATE INDEX ON {schema}.projects (owner_id);
        """

    async def apply(self, conn: Connection, schema: str, events: Events) -> None:
        rows = RowChanges(f"{schema}.projects", "id")
        for e in events:
            stamp = {"updated_at": e.occurred_at, "version": e.version, "position": e.seq}
            match e.data:
                case ProjectCreated() as d:
                    rows.insert(
                        e.aggregate_id,
                        name=d.name,
                        owner_id=d.owner_id,
                        max_concurrent_activations=d.limits.max_concurrent_activations,
                        created_at=e.occurred_at,
                        **stamp,
                    )
                case ProjectRenamed() as d:
                    rows.set(e.aggregate_id, name=d.name, **stamp)
                case ProjectLimitsChanged() as d:
                    rows.set(
                        e.aggregate_id,
                        max_concurrent_activations=d.limits.max_concurrent_activations,
                        **stamp,
                    )
        await rows.flush(conn)
