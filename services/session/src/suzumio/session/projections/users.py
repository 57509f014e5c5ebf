"""`proj_users`: users and their API keys (digests only; a key is never stored)."""

from __future__ import annotations

from typing import ClassVar

from suzumio.contracts.events import ApiKeyCreated, ApiKeyRevoked, UserCreated
from suzumio.platform.db.pool import Connection
from suzumio.platform.projections.base import Events, Projection
from suzumio.platform.projections.writes import RowChanges
from suzumio.session.projections.instants import instant


class UsersProjection(Projection):
    name: ClassVar[str] = "users"
    version: ClassVar[int] = 2  # 2: `expires_at` as instants.py reads it
    handles: ClassVar[frozenset[str]] = frozenset(
        c.event_type for c in (UserCreated, ApiKeyCreated, ApiKeyRevoked)
    )
    tables: ClassVar[tuple[str, ...]] = ("users", "api_keys")

    def ddl(self, schema: str) -> str:
        return f"""
        CREATE TABLE {schema}.users (
            id text PRIMARY KEY,
            name text NOT NULL,
            email text,
            admin boolean NOT NULL,
            created_at timestamptz NOT NULL,
            position bigint NOT NULL
        );
        CREATE TABLE {schema}.api_keys (
            key_id text PRIMARY KEY,
            user_id text NOT NULL,
            name text NOT NULL,
            digest text NOT NULL,
            created_at timestamptz NOT NULL,
            expires_at timestamptz,
            revoked_at timestamptz,
            position bigint NOT NULL
        );
        CREATE INDEX ON {schema}.api_keys (user_id);
        """

    async def apply(self, conn: Connection, schema: str, events: Events) -> None:
        users = RowChanges(f"{schema}.users", "id")
        keys = RowChanges(f"{schema}.api_keys", "key_id")
        for e in events:
            match e.data:
                case UserCreated() as d:
                    users.insert(
                        e.aggregate_id,
                        name=d.name,
                        email=d.email,
                        admin=d.admin,
                        created_at=e.occurred_at,
                        position=e.seq,
                    )
                case ApiKeyCreated() as d:
                    keys.insert(
                        d.key_id,
                        user_id=e.aggregate_id,
                        name=d.name,
                        digest=d.digest,
                        created_at=e.occurred_at,
                        expires_at=instant(d.expires_at),
                        revoked_at=None,
                        position=e.seq,
                    )
                case ApiKeyRevoked() as d:
                    keys.set(d.key_id, revoked_at=e.occurred_at, position=e.seq)
        await users.flush(conn)
        await keys.flush(conn)
