"""`proj_agents.agents`: one row per agent, with its current configuration."""

from __future__ import annotations

from typing import ClassVar

from suzumio.contracts.events import AgentCreated, AgentDisabled, AgentEnabled, AgentUpdated
from suzumio.platform.db.pool import Connection
from suzumio.platform.projections.base import Events, Projection
from suzumio.platform.projections.writes import RowChanges


class AgentsProjection(Projection):
    name: ClassVar[str] = "agents"
    version: ClassVar[int] = 2
    handles: ClassVar[frozenset[str]] = frozenset(
        c.event_type for c in (AgentCreated, AgentUpdated, AgentDisabled, AgentEnabled)
    )
    tables: ClassVar[tuple[str, ...]] = ("agents",)

    def ddl(self, schema: str) -> str:
        return f"""
        CREATE TABLE {schema}.agents (
            id text PRIMARY KEY,
            project_id text NOT NULL,
            name text NOT NULL,
            role text NOT NULL,
            prompt text NOT NULL,
            description text NOT NULL,
            model jsonb NOT NULL,
            fallbacks jsonb NOT NULL,
            tools jsonb NOT NULL,
            toolpacks jsonb NOT NULL,
            permissions jsonb NOT NULL,
            env_facts jsonb NOT NULL,
            assets jsonb NOT NULL,
            workspace_mode text NOT NULL,
            runtime_profile text,
            disabled boolean NOT NULL DEFAULT false,
            disabled_reason text NOT NULL DEFAULT '',
            created_at timestamptz NOT NULL,
            updated_at timestamptz NOT NULL,
            version integer NOT NULL,
            position bigint NOT NULL
        );
        CREATE INDEX ON {schema}.agents (project_id, created_at);
        """

    async def apply(self, conn: Connection, schema: str, events: Events) -> None:
        rows = RowChanges(f"{schema}.agents", "id")
        for e in events:
            stamp = {"updated_at": e.occurred_at, "version": e.version, "position": e.seq}
            match e.data:
                case AgentCreated() as d:
                    rows.insert(
                        e.aggregate_id,
                        **d.model_dump(mode="json"),
                        created_at=e.occurred_at,
                        **stamp,
                    )
                case AgentUpdated() as d:
                    changed = d.model_dump(
                        mode="json", exclude_none=True, exclude={"runtime_profile_cleared"}
                    )
                    if d.runtime_profile_cleared:
                        changed["runtime_profile"] = None
                    rows.set(e.aggregate_id, **changed, **stamp)
                case AgentDisabled() as d:
                    rows.set(e.aggregate_id, disabled=True, disabled_reason=d.reason, **stamp)
                case AgentEnabled():
                    rows.set(e.aggregate_id, disabled=False, disabled_reason="", **stamp)
        await rows.flush(conn)
