"""Running one piece of CLI work against the platform's NATS and Postgres."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import NoReturn, TypeVar

import asyncpg
from nats import errors as nats_errors
from nats.aio.client import Client as NATS

from suzumio.cli.failures import CONNECT_WITHIN, fail, first_line, load_settings, redact
from suzumio.contracts.errors import CommandError, UnavailableError
from suzumio.contracts.subjects import StreamSpec, Topology
from suzumio.platform.bus import connection
from suzumio.platform.bus.jsapi import (
    API_PREFIX,
    ERR_STREAM_NAME_IN_USE,
    ERR_STREAM_NOT_FOUND,
    request,
    stream_config,
)
from suzumio.platform.db import pool as db
from suzumio.platform.db.migrations import apply_migrations, platform_migrations
from suzumio.platform.db.pool import Pool
from suzumio.platform.db.trouble import POSTGRES_SUSPECTS, POSTGRES_TROUBLE, is_postgres_trouble
from suzumio.platform.errors import EmbeddedServerError, JetStreamApiError
from suzumio.platform.service.runtime import resolve_endpoints

T = TypeVar("T")

CLOSE_WITHIN = 3.0  # seconds for the pool's graceful close before it is dropped
JETSTREAM_WITHIN = 15.0  # seconds for JetStream's answers about the streams (it may be starting)
# A server that goes away while a command works (killed, restarted, a network cut) is told in
# one line, like one that never answered. NATS's timeout is an OSError too: it goes first.
_NATS_LOST: tuple[type[BaseException], ...] = (
    nats_errors.TimeoutError,
    nats_errors.NoRespondersError,
    nats_errors.ConnectionClosedError,
)


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
    except OSError as exc:  # a data directory that cannot be made or used (SUZUMIO_DATA_DIR)
        where = f": {exc.filename}" if exc.filename else ""
        fail(f"embedded servers in {settings.data_dir}: {exc.strerror or exc}{where}")

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
                await _streams_present(nc, nats_url, settings.topology().streams())
                await apply_migrations(pool, platform_migrations())
                return await work(Platform(nc, pool, dsn, settings.topology()))
            except CommandError as exc:
                fail(_refused(exc))
            except _NATS_LOST as exc:
                fail(f"NATS at {redact(nats_url)}: {first_line(exc)}")
            except (*POSTGRES_TROUBLE, *POSTGRES_SUSPECTS) as exc:
                _postgres_lost(exc, dsn)
            finally:
                await _closed(pool)
        finally:
            await nc.close()

    try:
        return asyncio.run(run())
    finally:
        if servers is not None:
            servers.stop()


def _postgres_lost(exc: Exception, dsn: str) -> NoReturn:
    if not is_postgres_trouble(exc):
        raise exc  # a bug of ours (a connection misused): its traceback, not a line
    fail(f"Postgres at {redact(dsn)}: {first_line(exc)}")


async def _closed(pool: Pool) -> None:
    """The pool closed, gracefully if that is quick: a connection still waiting for a statement
    cancelled by Ctrl-C (on a lock someone else holds) must not keep the command from ending."""
    try:
        await asyncio.wait_for(pool.close(), CLOSE_WITHIN)
    except (TimeoutError, asyncio.CancelledError):
        pool.terminate()


async def _streams_present(nc: NATS, nats_url: str, specs: tuple[StreamSpec, ...]) -> None:
    """Create the streams that are missing, and leave those that exist as they are.

    The services bring existing streams to their settings; a command must not: run with
    other settings (an operator's shell without `SUZUMIO_REPLICAS=3`) it would scale the
    event log of a cluster down to one replica.
    """

    async def ensure() -> None:
        for spec in specs:
            while True:
                try:
                    await _stream_present(nc, spec)
                    break
                except nats_errors.NoRespondersError:
                    if not _jetstream_announced(nc):
                        # No JetStream here, nor, as nobody answers, elsewhere in its cluster:
                        # said at once rather than after the wait below.
                        raise TimeoutError from None
                    await asyncio.sleep(0.2)  # JetStream still starting (an embedded server)

    where = f"NATS at {redact(nats_url)}"
    try:
        await asyncio.wait_for(ensure(), JETSTREAM_WITHIN)
    except (TimeoutError, nats_errors.TimeoutError):
        fail(f"{where} answers, but JetStream does not (is it enabled: nats-server -js?)")
    except JetStreamApiError as exc:
        fail(f"{where}: {first_line(exc)}")


def _jetstream_announced(nc: NATS) -> bool:
    """Whether the server said it runs JetStream when we connected (its INFO's `jetstream`;
    nats-py keeps the INFO only in a private field)."""
    info = getattr(nc, "_server_info", None)
    return bool(info.get("jetstream")) if isinstance(info, dict) else True


async def _stream_present(nc: NATS, spec: StreamSpec) -> None:
    try:
        await request(nc, f"{API_PREFIX}.STREAM.INFO.{spec.name}", None, JETSTREAM_WITHIN)
    except JetStreamApiError as exc:
        if exc.err_code != ERR_STREAM_NOT_FOUND:
            raise
    else:
        return
    try:
        create = f"{API_PREFIX}.STREAM.CREATE.{spec.name}"
        await request(nc, create, stream_config(spec), JETSTREAM_WITHIN)
    except JetStreamApiError as exc:
        if exc.err_code != ERR_STREAM_NAME_IN_USE:  # a service made it meanwhile: theirs
            raise


def _refused(exc: CommandError) -> str:
    if isinstance(exc, UnavailableError):
        # The servers answer but the services do not run against them (yet).
        return f"{first_line(exc)}; are the platform's services running?"
    return first_line(exc)
