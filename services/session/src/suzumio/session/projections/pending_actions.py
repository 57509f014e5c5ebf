"""`proj_pending_actions.pending_actions`: questions, approvals and file requests."""

from __future__ import annotations

from typing import ClassVar

from suzumio.contracts.events import (
    PendingActionAnswered,
    PendingActionCancelled,
    PendingActionCreated,
    PendingActionExpired,
)
from suzumio.platform.db.pool import Connection
from suzumio.platform.projections.base import Events, Projection
from suzumio.platform.projections.writes import RowChanges
from suzumio.session.projections.instants import instant


class PendingActionsProjection(Projection):
    name: ClassVar[str] = "pending_actions"
    # 2: `expires_at` as instants.py reads it; 3: paged in the log's order (`created_position`,
    # set once), not by the writer's clock
    version: ClassVar[int] = 3
    handles: ClassVar[frozenset[str]] = frozenset(
        c.event_type
        for c in (
            PendingActionCreated,
            PendingActionAnswered,
            PendingActionExpired,
            PendingActionCancelled,
        )
    )
    tables: ClassVar[tuple[str, ...]] = ("pending_actions",)

    def ddl(self, schema: str) -> str:
        return f"""
        CREATE TABLE {schema}.pending_actions (
            id text PRIMARY KEY,
            project_id text NOT NULL,
            session_id text NOT NULL,
            agent_id text NOT NULL,
            activation_id text,
            kind text NOT NULL,
            prompt text NOT NULL,
            options jsonb NOT NULL,
            paths jsonb NOT NULL,
            status text NOT NULL,
            answer text,
            approved boolean,
            artifact_ids jsonb,
            answered_by text,
            created_at timestamptz NOT NULL,
            expires_at timestamptz NOT NULL,
            closed_at timestamptz,
            position bigint NOT NULL,
            created_position bigint NOT NULL
        );
        CREATE INDEX ON {schema}.pending_actions (session_id, created_position, id);
        CREATE INDEX ON {schema}.pending_actions (expires_at) WHERE status = 'open';
        """

    async def apply(self, conn: Connection, schema: str, events: Events) -> None:
        rows = RowChanges(f"{schema}.pending_actions", "id")
        for e in events:
            closed = {"closed_at": e.occurred_at, "position": e.seq}
            match e.data:
                case PendingActionCreated() as d:
                    rows.insert(
                        e.aggregate_id,
                        **d.model_dump(mode="python", exclude={"expires_at"}),
                        expires_at=instant(d.expires_at),
                        status="open",
                        answer=None,
                        approved=None,
                        artifact_ids=None,
                        answered_by=None,
                        created_at=e.occurred_at,
                        closed_at=None,
                        position=e.seq,
                        created_position=e.seq,
                    )
                case PendingActionAnswered() as d:
                    rows.set(
                        e.aggregate_id,
                        status="answered",
                        answer=d.answer,
                        approved=d.approved,
                        artifact_ids=list(d.artifact_ids),
                        answered_by=d.answered_by,
                        **closed,
                    )
                case PendingActionExpired():
                    rows.set(e.aggregate_id, status="expired", **closed)
                case PendingActionCancelled():
                    rows.set(e.aggregate_id, status="cancelled", **closed)
        await rows.flush(conn)
