"""`proj_projects`: projects, their members, runtime profiles, providers and mount grants."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from suzumio.contracts.envelope import DomainEvent
from suzumio.contracts.events import (
    MemberAdded,
    MemberRemoved,
    MemberRoleChanged,
    MountGranted,
    MountRevoked,
    ProjectCreated,
    ProjectLimitsChanged,
    ProjectRenamed,
    ProviderRemoved,
    ProviderSet,
    RuntimeProfileRemoved,
    RuntimeProfileSet,
)
from suzumio.platform.db.pool import Connection
from suzumio.platform.projections.base import Events, Projection
from suzumio.platform.projections.writes import RowChanges

PROJECT_EVENTS = (
    ProjectCreated,
    ProjectRenamed,
    ProjectLimitsChanged,
    MemberAdded,
    MemberRoleChanged,
    MemberRemoved,
    RuntimeProfileSet,
    RuntimeProfileRemoved,
    ProviderSet,
    ProviderRemoved,
    MountGranted,
    MountRevoked,
)


class ProjectsProjection(Projection):
    name: ClassVar[str] = "projects"
    version: ClassVar[int] = 2
    handles: ClassVar[frozenset[str]] = frozenset(e.event_type for e in PROJECT_EVENTS)
    tables: ClassVar[tuple[str, ...]] = (
        "projects",
        "members",
        "runtime_profiles",
        "providers",
        "mount_grants",
    )

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
        CREATE TABLE {schema}.members (
            project_id text NOT NULL,
            user_id text NOT NULL,
            role text NOT NULL,
            since timestamptz NOT NULL,
            position bigint NOT NULL,
            PRIMARY KEY (project_id, user_id)
        );
        CREATE INDEX ON {schema}.members (user_id);
        CREATE TABLE {schema}.runtime_profiles (
            project_id text NOT NULL,
            name text NOT NULL,
            spec jsonb NOT NULL,
            updated_at timestamptz NOT NULL,
            position bigint NOT NULL,
            PRIMARY KEY (project_id, name)
        );
        CREATE TABLE {schema}.providers (
            project_id text NOT NULL,
            name text NOT NULL,
            kind text NOT NULL,
            base_url text NOT NULL,
            model text NOT NULL,
            fallbacks jsonb NOT NULL,
            api_key_set boolean NOT NULL,
            updated_at timestamptz NOT NULL,
            position bigint NOT NULL,
            PRIMARY KEY (project_id, name)
        );
        CREATE TABLE {schema}.mount_grants (
            id text PRIMARY KEY,
            project_id text NOT NULL,
            agent_id text,
            host_path text NOT NULL,
            target text NOT NULL,
            mode text NOT NULL,
            created_at timestamptz NOT NULL,
            position bigint NOT NULL
        );
        CREATE INDEX ON {schema}.mount_grants (project_id);
        """

    async def apply(self, conn: Connection, schema: str, events: Events) -> None:
        projects = RowChanges(f"{schema}.projects", "id")
        statements: list[tuple[str, tuple[Any, ...]]] = []  # other tables, in log order
        for e in events:
            stamp = {"updated_at": e.occurred_at, "version": e.version, "position": e.seq}
            match e.data:
                case ProjectCreated() as d:
                    limit = d.limits.max_concurrent_activations
                    projects.insert(
                        e.aggregate_id,
                        name=d.name,
                        owner_id=d.owner_id,
                        max_concurrent_activations=limit,
                        created_at=e.occurred_at,
                        **stamp,
                    )
                case ProjectRenamed() as d:
                    projects.set(e.aggregate_id, name=d.name, **stamp)
                case ProjectLimitsChanged() as d:
                    limit = d.limits.max_concurrent_activations
                    projects.set(e.aggregate_id, max_concurrent_activations=limit, **stamp)
                case _:
                    projects.set(e.aggregate_id, **stamp)
            statement = _statement(e.aggregate_id, e.data, e.occurred_at, e.seq)
            if statement is not None:
                statements.append(statement)
        await projects.flush(conn)
        for kind, args in statements:  # rare next to the rest of the log: one statement each
            await conn.execute(_SQL[kind].format(s=schema), *args)


def _statement(  # noqa: PLR0911 - one return per event type
    pid: str, data: DomainEvent, at: datetime, seq: int
) -> tuple[str, tuple[Any, ...]] | None:
    """The row change an event makes outside `projects`, if any."""
    match data:
        case ProjectCreated():
            return "member", (pid, data.owner_id, "owner", at, seq)
        case MemberAdded() | MemberRoleChanged():
            return "member", (pid, data.user_id, data.role.value, at, seq)
        case MemberRemoved():
            return "member-", (pid, data.user_id)
        case RuntimeProfileSet():
            return "profile", (pid, data.name, data.spec.model_dump(mode="json"), at, seq)
        case RuntimeProfileRemoved():
            return "profile-", (pid, data.name)
        case ProviderSet():
            s = data.spec
            fallbacks = [m.model_dump(mode="json") for m in s.fallbacks]
            return "provider", (
                pid,
                data.name,
                s.kind,
                s.base_url,
                s.model,
                fallbacks,
                s.api_key is not None,
                at,
                seq,
            )
        case ProviderRemoved():
            return "provider-", (pid, data.name)
        case MountGranted():
            return "mount", (
                data.grant_id,
                pid,
                data.agent_id,
                data.host_path,
                data.target,
                data.mode.value,
                at,
                seq,
            )
        case MountRevoked():
            return "mount-", (data.grant_id,)
    return None


_SQL = {
    "member": "INSERT INTO {s}.members VALUES ($1, $2, $3, $4, $5) ON CONFLICT (project_id,"
    " user_id) DO UPDATE SET role = excluded.role, position = excluded.position",
    "member-": "DELETE FROM {s}.members WHERE project_id = $1 AND user_id = $2",
    "profile": "INSERT INTO {s}.runtime_profiles VALUES ($1, $2, $3, $4, $5) ON CONFLICT"
    " (project_id, name) DO UPDATE SET spec = excluded.spec, updated_at = excluded.updated_at,"
    " position = excluded.position",
    "profile-": "DELETE FROM {s}.runtime_profiles WHERE project_id = $1 AND name = $2",
    "provider": "INSERT INTO {s}.providers VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
    " ON CONFLICT (project_id, name) DO UPDATE SET kind = excluded.kind,"
    " base_url = excluded.base_url, model = excluded.model, fallbacks = excluded.fallbacks,"
    " api_key_set = excluded.api_key_set, updated_at = excluded.updated_at,"
    " position = excluded.position",
    "provider-": "DELETE FROM {s}.providers WHERE project_id = $1 AND name = $2",
    "mount": "INSERT INTO {s}.mount_grants VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    "mount-": "DELETE FROM {s}.mount_grants WHERE id = $1",
}
