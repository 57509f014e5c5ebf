"""asyncpg pools configured the same way in every process."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

Pool = asyncpg.Pool
Connection = asyncpg.Connection


async def _init_connection(conn: Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    await conn.set_type_codec("json", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


# The server's side of a single connection: a peer that vanished without closing it (its
# host lost power, the network was cut) is noticed after about 5 + 3 * 2 seconds of silence,
# instead of the kernel's default two hours. Until then the server keeps the session, and with
# it every advisory lock it holds: leadership would stay with a dead replica and no other
# could lead. A peer that is merely slow (a long pause of its process) still answers the
# probes from its kernel, and keeps its lock. Keepalives are only sent while nothing is on its
# way: if the peer vanished while the server was sending (a heartbeat's answer, a notice), the
# kernel retransmits for ~15 minutes instead, so `tcp_user_timeout` bounds unacknowledged data
# to the same 11 s (a paused process's kernel still acknowledges). Set by statements, not as
# startup parameters, which a connection pooler in between may refuse. (Ignored on Unix-domain
# sockets.)
_KEEPALIVES = (
    "SET tcp_keepalives_idle = 5; SET tcp_keepalives_interval = 2; SET tcp_keepalives_count = 3;"
    " SET tcp_user_timeout = 11000"
)


async def connect(dsn: str, application: str) -> Connection:
    """A single connection (for locks that must live exactly as long as it does)."""
    conn: Connection = await asyncpg.connect(dsn, server_settings={"application_name": application})
    await conn.execute(_KEEPALIVES)
    await _init_connection(conn)
    return conn


async def _keep_as_is(conn: Connection) -> None:
    """Pool connections carry no session state (no LISTEN, no temp tables, no session locks
    left held): skip asyncpg's reset round trip on every release."""


async def create_pool(
    dsn: str, application: str, *, min_size: int = 1, max_size: int = 10, **kwargs: Any
) -> Pool:
    pool = await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        init=_init_connection,
        reset=_keep_as_is,
        server_settings={"application_name": application},
        **kwargs,
    )
    assert pool is not None
    return pool
