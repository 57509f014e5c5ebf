"""The `suzumio.projection_checkpoints` rows: where each projection stands in the log."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from suzumio.platform.db.pool import Connection, Pool
from suzumio.platform.projections.base import Projection, live_schema
from suzumio.platform.projections.positions import CHANNEL

NOT_BUILT = 0  # version of a row whose projection has never been built


@dataclass(frozen=True, slots=True)
class Checkpoint:
    name: str
    position: int
    version: int
    rebuilt_at: datetime | None = None


async def ensure_rows(conn: Connection, projections: Iterable[Projection]) -> None:
    await conn.executemany(
        "INSERT INTO suzumio.projection_checkpoints (name, position, version, schema_name,"
        " serving) VALUES ($1, 0, $2, $3, false) ON CONFLICT (name) DO NOTHING",
        [(p.name, NOT_BUILT, live_schema(p.name)) for p in projections],
    )


async def mark_serving(conn: Connection, projections: Iterable[Projection]) -> None:
    """Rows of the given projections serve when their tables are of the code's version; every
    other row (outdated, held, or of a projection no longer registered) stops serving. Only
    rows that change are written, and watchers are told (`positions.notify`) when any did:
    else they saw it at their next poll, seconds on (the gateway trusting frozen keys)."""
    versions = {p.name: p.version for p in projections}
    async with conn.transaction():
        # Locked first in name order, as every locker of these rows does (`lock_rows`): an
        # UPDATE alone locks them in the order it finds them, and met a rebuild's swap
        # holding the first by name — a deadlock, which could abort the swap after its
        # whole replay.
        await conn.execute("SELECT 1 FROM suzumio.projection_checkpoints ORDER BY name FOR UPDATE")
        # Arrays, not a JSON object: the connections' jsonb codec encodes what it is given,
        # and a JSON text passed in was encoded again — a string, whose fields were all
        # NULL, so every projection stopped serving whenever a projector began to lead (each
        # restart), and every write's read-your-writes wait ran out (504).
        changed = await conn.fetch(
            "WITH wanted AS (SELECT c.name, coalesce(c.version = w.version, false) AS serving"
            " FROM suzumio.projection_checkpoints c"
            " LEFT JOIN unnest($1::text[], $2::int[]) AS w(name, version) ON w.name = c.name)"
            " UPDATE suzumio.projection_checkpoints AS c SET serving = wanted.serving"
            " FROM wanted WHERE wanted.name = c.name AND c.serving IS DISTINCT FROM wanted.serving"
            " RETURNING c.name",
            list(versions),
            list(versions.values()),
        )
        if changed:
            await conn.execute("SELECT pg_notify($1, '0')", CHANNEL)


async def announce(conn: Connection, projections: Iterable[Projection]) -> None:
    """Say that a projector that can build these projections' versions is running."""
    names = [p.name for p in projections]
    await conn.execute(
        "INSERT INTO suzumio.projector_presence (name, version)"
        " SELECT * FROM unnest($1::text[], $2::int[])"
        " ON CONFLICT (name, version) DO UPDATE SET seen_at = now()",
        names,
        [p.version for p in projections],
    )


async def versions_around(conn: Connection, names: list[str], seconds: float) -> dict[str, int]:
    """The latest version of each projection a projector announced in the last `seconds`
    (absent: none did)."""
    rows = await conn.fetch(
        "SELECT name, max(version) AS version FROM suzumio.projector_presence"
        " WHERE name = ANY($1::text[]) AND seen_at > now() - make_interval(secs => $2)"
        " GROUP BY name",
        names,
        seconds,
    )
    return {r["name"]: r["version"] for r in rows}


_SELECT = (
    "SELECT name, position, version, rebuilt_at FROM suzumio.projection_checkpoints"
    " WHERE name = ANY($1::text[]) ORDER BY name"
)


async def read_rows(conn: Connection, names: list[str]) -> dict[str, Checkpoint]:
    return _by_name(await conn.fetch(_SELECT, names))


async def lock_rows(conn: Connection, names: list[str]) -> dict[str, Checkpoint]:
    """Read and row-lock the checkpoints until the transaction ends (in name order, so that
    lockers never deadlock)."""
    return _by_name(await conn.fetch(_SELECT + " FOR UPDATE", names))


def _by_name(rows: list[Any]) -> dict[str, Checkpoint]:
    return {
        r["name"]: Checkpoint(r["name"], r["position"], r["version"], r["rebuilt_at"]) for r in rows
    }


async def move(
    conn: Connection, positions: Mapping[str, int], *, announce: int, held: Iterable[str] = ()
) -> None:
    """Move the checkpoints and tell watchers (`positions.notify`) that read models reached
    `announce`, at commit: one statement, one round trip, however many projections move.
    `held`: projections that stop serving (held at an event this code cannot read)."""
    if held:
        await conn.execute(
            "UPDATE suzumio.projection_checkpoints SET serving = false"
            " WHERE name = ANY($1::text[]) AND serving",
            sorted(held),
        )
    await conn.execute(
        "WITH moved AS (UPDATE suzumio.projection_checkpoints AS c"
        " SET position = m.position, updated_at = now()"
        " FROM unnest($1::text[], $2::bigint[]) AS m(name, position) WHERE c.name = m.name)"
        " SELECT pg_notify($3, $4)",
        list(positions),
        list(positions.values()),
        CHANNEL,
        str(announce),
    )


async def read_all(pool: Pool) -> dict[str, Checkpoint]:
    return _by_name(
        await pool.fetch(
            "SELECT name, position, version, rebuilt_at FROM suzumio.projection_checkpoints"
        )
    )
