"""Running one piece of CLI work against the platform's NATS and Postgres."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import asyncpg
from nats.aio.client import Client as NATS

from suzumio.cli.failures import CONNECT_WITHIN, fail, first_line, load_settings, redact
from suzumio.contracts.errors import CommandError, UnavailableError
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus import connection
from suzumio.platform.bus.jsapi import ensure_streams
from suzumio.platform.db import pool as db
from suzumio.platform.db.migrations import apply_migrations, platform_migrations
from suzumio.platform.db.pool import Pool
from suzumio.platform.errors import EmbeddedServerError
from suzumio.platform.service.runtime import resolve_endpoints

T = TypeVar("T")


@dataclass(frozen=True)
class Platform:
    nc: NATS
    pool: Pool
    dsn: str
    topology: Topology


def with_platform(work: Callable[[Platform], Awaitable[T]]) -> T:
    """Connect (borrowing or starting the embedded servers when no URLs are set), make sure
    streams and tables exist, run `work`, and disconnect.

    Unlike a service, which waits for its servers as long as it takes, a command gives them
    `CONNECT_WITHIN` seconds and then exits 1 with a line naming the URL. A command `work`
    sends that the platform refuses or leaves unanswered exits 1 the same way.
    """
    settings = load_settings()
    try:
        nats_url, dsn, servers = resolve_endpoints(settings)
    except EmbeddedServerError as exc:
        fail(f"embedded servers in {settings.data_dir}: {first_line(exc)}")

    async def run() -> T:
        try:
            nc = await connection.connect(
                nats_url, "suzumio-cli", first_connect_within=CONNECT_WITHIN
            )
        except connection.NatsUnreachableError as exc:
            fail(first_line(exc).replace(nats_url, redact(nats_url)))  # it names the URL
        try:
            try:
                pool = await asyncio.wait_for(
                    db.create_pool(dsn, "suzumio-cli", max_size=2), CONNECT_WITHIN
                )
            except (OSError, TimeoutError, ValueError, asyncpg.PostgresError,
                    asyncpg.InterfaceError) as exc:  # fmt: skip
                reason = first_line(exc) if str(exc) else f"no answer within {CONNECT_WITHIN:g} s"
                fail(f"Postgres at {redact(dsn)}: {reason}")
            try:
                await ensure_streams(nc, settings.topology().streams())
                await apply_migrations(pool, platform_migrations())
                return await work(Platform(nc, pool, dsn, settings.topology()))
            except CommandError as exc:
                fail(_refused(exc))
            finally:
                await pool.close()
        finally:
            await nc.close()

    try:
        return asyncio.run(run())
    finally:
        if servers is not None:
            servers.stop()


def _refused(exc: CommandError) -> str:
    if isinstance(exc, UnavailableError):
        # The servers answer but the services do not run against them (yet).
        return f"{first_line(exc)}; are the platform's services running?"
    return first_line(exc)
