"""`proj_signals.signals`: every signal with its priority and where it went."""

from __future__ import annotations

from typing import ClassVar

from suzumio.contracts.events import SignalClosed, SignalRecorded, SignalsDelivered
from suzumio.platform.db.pool import Connection
from suzumio.platform.projections.base import Events, Projection
from suzumio.platform.projections.writes import RowChanges
from suzumio.session.projections.instants import instant


class SignalsProjection(Projection):
    name: ClassVar[str] = "signals"
    # 2: keyed by session and signal (a signal's id is unique within its session only).
    # 3: `not_before` without a timezone is UTC (see instants.py).
    version: ClassVar[int] = 3
    handles: ClassVar[frozenset[str]] = frozenset(
        {SignalRecorded.event_type, SignalsDelivered.event_type, SignalClosed.event_type}
    )
    tables: ClassVar[tuple[str, ...]] = ("signals",)

    def ddl(self, schema: str) -> str:
        return f"""
        CREATE TABLE {schema}.signals (
            id text NOT NULL,
            session_id text NOT NULL,
            agent_id text NOT NULL,
            kind text NOT NULL,
            priority text NOT NULL,
            status text NOT NULL,
            payload jsonb NOT NULL,
            message_id text,
            not_before timestamptz,
            activation_id text,
            reason text NOT NULL DEFAULT '',
            created_at timestamptz NOT NULL,
            updated_at timestamptz NOT NULL,
            position bigint NOT NULL,
            PRIMARY KEY (session_id, id)
        );
        CREATE INDEX ON {schema}.signals (session_id, status);
        CREATE INDEX ON {schema}.signals (activation_id);
        """

    async def apply(self, conn: Connection, schema: str, events: Events) -> None:
        rows = RowChanges(f"{schema}.signals", ("session_id", "id"))
        for e in events:
            stamp = {"updated_at": e.occurred_at, "position": e.seq}
            match e.data:
                case SignalRecorded() as d:
                    rows.insert(
                        (e.aggregate_id, d.signal_id),
                        agent_id=d.agent_id,
                        kind=d.kind.value,
                        priority=d.priority.value,
                        status="pending",
                        payload=d.payload,
                        message_id=d.message_id,
                        not_before=instant(d.not_before),
                        activation_id=None,
                        reason="",
                        created_at=e.occurred_at,
                        **stamp,
                    )
                case SignalsDelivered() as d:
                    for signal_id in d.signal_ids:
                        rows.set(
                            (e.aggregate_id, signal_id),
                            status="delivered",
                            activation_id=d.activation_id,
                            **stamp,
                        )
                case SignalClosed() as d:
                    rows.set(
                        (e.aggregate_id, d.signal_id),
                        status=d.outcome.value,
                        reason=d.reason,
                        **stamp,
                    )
        await rows.flush(conn)
