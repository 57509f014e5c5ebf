"""`proj_tool_calls.tool_calls`: the audit record of every tool call of an activation."""

from __future__ import annotations

from typing import Any, ClassVar

from suzumio.contracts.events import ToolCallFinished, ToolCallStarted
from suzumio.platform.db.pool import Connection
from suzumio.platform.projections.base import Events, Projection
from suzumio.platform.projections.writes import clean


class ToolCallsProjection(Projection):
    name: ClassVar[str] = "tool_calls"
    # 2: NUL in a record's text no longer parks it; 3: the index the paged list reads by;
    # 4: paged in the log's order (`started_position`, set once), not by the writer's clock
    version: ClassVar[int] = 4
    handles: ClassVar[frozenset[str]] = frozenset(
        c.event_type for c in (ToolCallStarted, ToolCallFinished)
    )
    tables: ClassVar[tuple[str, ...]] = ("tool_calls",)

    def ddl(self, schema: str) -> str:
        return f"""
        CREATE TABLE {schema}.tool_calls (
            activation_id text NOT NULL,
            call_id text NOT NULL,
            tool text NOT NULL,
            arguments_digest text NOT NULL,
            arguments_size integer NOT NULL,
            status text NOT NULL,
            result_digest text,
            result_size integer,
            duration_ms integer,
            error text,
            started_at timestamptz NOT NULL,
            finished_at timestamptz,
            position bigint NOT NULL,
            started_position bigint NOT NULL,
            PRIMARY KEY (activation_id, call_id)
        );
        CREATE INDEX ON {schema}.tool_calls (activation_id, started_position, call_id);
        """

    async def apply(self, conn: Connection, schema: str, events: Events) -> None:
        started: list[tuple[Any, ...]] = []
        finished: list[tuple[Any, ...]] = []
        for e in events:  # a call's start always precedes its finish in the log
            match e.data:
                case ToolCallStarted() as d:
                    started.append(
                        _row(
                            e.aggregate_id,
                            d.call_id,
                            d.tool,
                            d.arguments_digest,
                            d.arguments_size,
                            e.occurred_at,
                            e.seq,
                        )
                    )
                case ToolCallFinished() as d:
                    finished.append(
                        _row(
                            e.aggregate_id,
                            d.call_id,
                            d.status,
                            d.result_digest,
                            d.result_size,
                            d.duration_ms,
                            d.error,
                            e.occurred_at,
                            e.seq,
                        )
                    )
        if started:
            await conn.executemany(
                f"INSERT INTO {schema}.tool_calls (activation_id, call_id, tool, arguments_digest,"
                " arguments_size, status, started_at, position, started_position)"
                " VALUES ($1, $2, $3, $4, $5, 'running', $6, $7, $7)",
                started,
            )
        if finished:
            await conn.executemany(
                f"UPDATE {schema}.tool_calls SET status = $3, result_digest = $4,"
                " result_size = $5, duration_ms = $6, error = $7, finished_at = $8,"
                " position = $9 WHERE activation_id = $1 AND call_id = $2",
                finished,
            )


def _row(*values: Any) -> tuple[Any, ...]:
    # NUL replaced as in every other read model: Postgres text refuses it, and a call the
    # event's plain `str` fields let it into must not go missing from the audit (parked).
    return tuple(clean(v) for v in values)
