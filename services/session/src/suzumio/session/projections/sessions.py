"""`proj_sessions.sessions` (one row per session) and `proj_sessions.messages` (its history)."""

from __future__ import annotations

from typing import Any, ClassVar

from suzumio.contracts.events import (
    SessionClosed,
    SessionMessageAppended,
    SessionOpened,
    SessionReopened,
)
from suzumio.platform.db.pool import Connection
from suzumio.platform.projections.base import Events, Projection
from suzumio.platform.projections.writes import RowChanges, clean


class SessionsProjection(Projection):
    name: ClassVar[str] = "sessions"
    # 2: a message id is unique within its session only.
    version: ClassVar[int] = 2
    handles: ClassVar[frozenset[str]] = frozenset(
        {
            SessionOpened.event_type,
            SessionMessageAppended.event_type,
            SessionClosed.event_type,
            SessionReopened.event_type,
        }
    )
    tables: ClassVar[tuple[str, ...]] = ("sessions", "messages")

    def ddl(self, schema: str) -> str:
        return f"""
        CREATE TABLE {schema}.sessions (
            id text PRIMARY KEY,
            project_id text NOT NULL,
            agent_id text NOT NULL,
            title text NOT NULL,
            status text NOT NULL,
            message_count integer NOT NULL,
            last_message_at timestamptz,
            opened_at timestamptz NOT NULL,
            closed_at timestamptz,
            close_reason text NOT NULL DEFAULT '',
            updated_at timestamptz NOT NULL,
            version integer NOT NULL,
            position bigint NOT NULL
        );
        CREATE INDEX ON {schema}.sessions (project_id, opened_at);
        CREATE INDEX ON {schema}.sessions (agent_id);
        CREATE TABLE {schema}.messages (
            session_id text NOT NULL,
            version integer NOT NULL,
            message_id text NOT NULL,
            author_kind text NOT NULL,
            author_id text NOT NULL,
            role text NOT NULL,
            text text NOT NULL,
            created_at timestamptz NOT NULL,
            position bigint NOT NULL,
            PRIMARY KEY (session_id, version),
            UNIQUE (session_id, message_id)
        );
        """

    async def apply(self, conn: Connection, schema: str, events: Events) -> None:
        sessions = RowChanges(f"{schema}.sessions", "id")
        messages: list[tuple[Any, ...]] = []
        for e in events:
            stamp = {"updated_at": e.occurred_at, "version": e.version, "position": e.seq}
            match e.data:
                case SessionOpened() as d:
                    sessions.insert(
                        e.aggregate_id,
                        project_id=d.project_id,
                        agent_id=d.agent_id,
                        title=d.title,
                        status="active",
                        message_count=0,
                        last_message_at=None,
                        opened_at=e.occurred_at,
                        closed_at=None,
                        close_reason="",
                        **stamp,
                    )
                case SessionMessageAppended() as d:
                    messages.append(
                        tuple(
                            clean(v)
                            for v in (
                                e.aggregate_id,
                                e.version,
                                d.message_id,
                                d.author.kind,
                                d.author.id,
                                d.role,
                                d.text,
                                e.occurred_at,
                                e.seq,
                            )
                        )
                    )
                    sessions.incr(e.aggregate_id, message_count=1)
                    sessions.set(e.aggregate_id, last_message_at=e.occurred_at, **stamp)
                case SessionClosed() as d:
                    sessions.set(
                        e.aggregate_id,
                        status="closed",
                        closed_at=e.occurred_at,
                        close_reason=d.reason,
                        **stamp,
                    )
                case SessionReopened():
                    sessions.set(
                        e.aggregate_id, status="active", closed_at=None, close_reason="", **stamp
                    )
        await sessions.flush(conn)
        if messages:
            await conn.executemany(
                f"INSERT INTO {schema}.messages (session_id, version, message_id, author_kind,"
                " author_id, role, text, created_at, position)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                messages,
            )
