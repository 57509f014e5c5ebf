"""Running one piece of CLI work against the platform's NATS and Postgres."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from nats.aio.client import Client as NATS

from suzumio.contracts.subjects import Topology
from suzumio.platform.bus import connection
from suzumio.platform.bus.jsapi import ensure_streams
from suzumio.platform.db import pool as db
from suzumio.platform.db.migrations import apply_migrations, platform_migrations
from suzumio.platform.db.pool import Pool
from suzumio.platform.service.runtime import resolve_endpoints
from suzumio.platform.settings import PlatformSettings

T = TypeVar("T")


@dataclass(frozen=True)
class Platform:
    nc: NATS
    pool: Pool
    dsn: str
    topology: Topology


def with_platform(work: Callable[[Platform], Awaitable[T]]) -> T:
    """Connect (borrowing or starting the embedded servers when no URLs are set), make sure
    streams and tables exist, run `work`, and disconnect."""
    settings = PlatformSettings()
    nats_url, dsn, servers = resolve_endpoints(settings)

    async def run() -> T:
        nc = await connection.connect(nats_url, "suzumio-cli")
        pool = await db.create_pool(dsn, "suzumio-cli", max_size=2)
        try:
            await ensure_streams(nc, settings.topology().streams())
            await apply_migrations(pool, platform_migrations())
            return await work(Platform(nc, pool, dsn, settings.topology()))
        finally:
            await pool.close()
            await nc.close()

    try:
        return asyncio.run(run())
    finally:
        if servers is not None:
            servers.stop()
