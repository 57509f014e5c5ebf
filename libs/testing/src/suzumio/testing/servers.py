"""Real servers for tests, and per-test isolation on them.

One NATS and one Postgres serve a whole test session; each test gets its own topology
namespace (streams and subjects) and its own database, so tests never see each other's data.
`SUZUMIO_TEST_NATS_URL` / `SUZUMIO_TEST_DATABASE_URL` point the tests at servers of your own
instead (the database URL must allow CREATE DATABASE).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from suzumio.contracts.subjects import Topology
from suzumio.platform.embedded import start_nats, start_postgres


@contextmanager
def nats_server(store_dir: Path) -> Iterator[str]:
    external = os.environ.get("SUZUMIO_TEST_NATS_URL")
    if external:
        yield external
        return
    server = start_nats(store_dir)
    try:
        yield server.url
    finally:
        server.stop()


@contextmanager
def postgres_server(data_dir: Path) -> Iterator[str]:
    external = os.environ.get("SUZUMIO_TEST_DATABASE_URL")
    if external:
        yield external
        return
    server = start_postgres(data_dir, durable=False)
    try:
        yield server.url
    finally:
        server.stop()


def fresh_topology() -> Topology:
    return Topology(namespace=f"t{uuid.uuid4().hex[:12]}")


def with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


async def create_database(server_url: str) -> str:
    """A new, empty database on the server; returns its URL."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return with_database(server_url, name)


async def drop_database(server_url: str, database_url: str) -> None:
    name = urlsplit(database_url).path.lstrip("/")
    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()
