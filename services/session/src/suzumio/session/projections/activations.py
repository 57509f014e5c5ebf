"""`proj_activations.activations`: each activation from request to its terminal state."""

from __future__ import annotations

from typing import ClassVar

from suzumio.contracts.events import (
    ActivationCancelled,
    ActivationCancelRequested,
    ActivationCompleted,
    ActivationFailed,
    ActivationRequested,
    ActivationStarted,
    ActivationTimedOut,
)
from suzumio.platform.db.pool import Connection
from suzumio.platform.projections.base import Events, Projection
from suzumio.platform.projections.writes import RowChanges


class ActivationsProjection(Projection):
    name: ClassVar[str] = "activations"
    # 2: the project is known from the request on. 3: a start stored after the end (the
    # orchestrator appends it at whatever head the subject has) leaves the end standing.
    version: ClassVar[int] = 3
    handles: ClassVar[frozenset[str]] = frozenset(
        cls.event_type
        for cls in (
            ActivationRequested,
            ActivationCancelRequested,
            ActivationStarted,
            ActivationCompleted,
            ActivationFailed,
            ActivationCancelled,
            ActivationTimedOut,
        )
    )
    tables: ClassVar[tuple[str, ...]] = ("activations",)

    def ddl(self, schema: str) -> str:
        return f"""
        CREATE TABLE {schema}.activations (
            id text PRIMARY KEY,
            session_id text NOT NULL,
            agent_id text NOT NULL,
            project_id text,
            status text NOT NULL,
            reason text NOT NULL,
            attempt integer NOT NULL,
            pool text,
            signal_ids jsonb NOT NULL,
            cancel_requested boolean NOT NULL DEFAULT false,
            backend text,
            sandbox_id text,
            exit_code integer,
            output_text text,
            usage jsonb,
            end_reason text,
            requested_at timestamptz NOT NULL,
            started_at timestamptz,
            ended_at timestamptz,
            updated_at timestamptz NOT NULL,
            position bigint NOT NULL
        );
        CREATE INDEX ON {schema}.activations (session_id, requested_at);
        CREATE INDEX ON {schema}.activations (status);
        """

    async def apply(self, conn: Connection, schema: str, events: Events) -> None:
        rows = RowChanges(f"{schema}.activations", "id")
        started: list[str] = []
        for e in events:
            stamp = {"updated_at": e.occurred_at, "position": e.seq}
            ended = {"ended_at": e.occurred_at, **stamp}
            match e.data:
                case ActivationRequested() as d:
                    rows.insert(
                        d.activation_id,
                        session_id=e.aggregate_id,
                        agent_id=d.agent_id,
                        project_id=d.project_id,
                        status="requested",
                        reason=d.reason.value,
                        attempt=d.attempt,
                        pool=d.pool,
                        signal_ids=list(d.signal_ids),
                        requested_at=e.occurred_at,
                        **stamp,
                    )
                case ActivationCancelRequested() as d:
                    rows.set(d.activation_id, cancel_requested=True, **stamp)
                case ActivationStarted() as d:
                    # Where it runs, always; `running` only if nothing ended it yet (below).
                    started.append(e.aggregate_id)
                    rows.set(
                        e.aggregate_id,
                        project_id=d.project_id,
                        backend=d.backend,
                        sandbox_id=d.sandbox_id,
                        started_at=e.occurred_at,
                        **stamp,
                    )
                case ActivationCompleted() as d:
                    rows.set(
                        e.aggregate_id,
                        status="completed",
                        output_text=d.text,
                        usage=d.usage,
                        exit_code=d.exit_code,
                        end_reason=d.reason,
                        **ended,
                    )
                case ActivationFailed() as d:
                    rows.set(
                        e.aggregate_id,
                        status="failed",
                        exit_code=d.exit_code,
                        end_reason=d.reason,
                        **ended,
                    )
                case ActivationCancelled() as d:
                    rows.set(
                        e.aggregate_id,
                        status="cancelled",
                        exit_code=d.exit_code,
                        end_reason=d.reason,
                        **ended,
                    )
                case ActivationTimedOut() as d:
                    rows.set(
                        e.aggregate_id,
                        status="timed_out",
                        exit_code=d.exit_code,
                        end_reason=f"timed out after {d.timeout_seconds:g}s",
                        **ended,
                    )
        await rows.flush(conn)
        if started:
            # After the batch's other changes, so it sees an end of this batch too: a late
            # start never turns a terminal status back into `running` (for ever).
            await conn.execute(
                f"UPDATE {schema}.activations SET status = 'running'"
                " WHERE id = ANY($1::text[]) AND status = 'requested'",
                started,
            )
