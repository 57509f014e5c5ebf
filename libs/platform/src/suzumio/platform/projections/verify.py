"""Checking a projection against the log: rebuild it aside and compare table contents."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nats.aio.client import Client as NATS

from suzumio.contracts.subjects import Topology
from suzumio.platform.db import pool as db
from suzumio.platform.projections.base import Projection, live_schema
from suzumio.platform.projections.rebuild import rebuild


@dataclass(frozen=True)
class TableDiff:
    table: str
    only_live: int
    only_rebuilt: int

    @property
    def equal(self) -> bool:
        return self.only_live == 0 and self.only_rebuilt == 0


@dataclass(frozen=True)
class Verification:
    projection: str
    position: int
    tables: tuple[TableDiff, ...]

    @property
    def equal(self) -> bool:
        return all(t.equal for t in self.tables)


async def diff_schemas(
    conn: db.Connection, projection: Projection, left: str, right: str
) -> tuple[TableDiff, ...]:
    """Rows present in one schema's tables but not the other's (as multisets)."""
    diffs = []
    for table in projection.tables:
        a, b = f'"{left}".{table}', f'"{right}".{table}'
        only_a = await conn.fetchval(f"SELECT count(*) FROM (TABLE {a} EXCEPT ALL TABLE {b}) d")
        only_b = await conn.fetchval(f"SELECT count(*) FROM (TABLE {b} EXCEPT ALL TABLE {a}) d")
        diffs.append(TableDiff(table, only_a, only_b))
    return tuple(diffs)


async def verify(
    nc: NATS, dsn: str, topology: Topology, projections: Sequence[Projection]
) -> list[Verification]:
    """Rebuild the projections into scratch schemas and compare them with the live tables.

    Meaningful when no events arrive meanwhile (or after the live projector caught up with the
    position reported): otherwise the two may differ by the newest events.
    """
    scratch = {p.name: f"{live_schema(p.name)}__verify" for p in projections}
    results = await rebuild(nc, dsn, topology, projections, swap=False, schemas=scratch)
    conn = await db.connect(dsn, "suzumio-verify")
    try:
        checked = []
        for p, result in zip(projections, results, strict=True):
            tables = await diff_schemas(conn, p, live_schema(p.name), scratch[p.name])
            await conn.execute(f'DROP SCHEMA "{scratch[p.name]}" CASCADE')
            checked.append(Verification(p.name, result.position, tables))
    finally:
        await conn.close()
    return checked
