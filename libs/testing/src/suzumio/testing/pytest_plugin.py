"""pytest fixtures (registered through the `pytest11` entry point).

Session scope: `nats_url`, `postgres_url` (the servers). Test scope: `topology` (a fresh
namespace), `database_url` (a fresh database), `nc`, `store`, `pool` (migrated), `commands`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from suzumio.contracts.subjects import Topology
from suzumio.platform.bus import connection
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.bus.jsapi import ensure_streams
from suzumio.platform.db import pool as db
from suzumio.platform.db.migrations import apply_migrations, platform_migrations
from suzumio.platform.db.pool import Pool
from suzumio.testing import servers


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with servers.nats_server(Path(tmp_path_factory.mktemp("nats"))) as url:
        yield url


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with servers.postgres_server(Path(tmp_path_factory.mktemp("pg")) / "data") as url:
        yield url


@pytest.fixture
def topology() -> Topology:
    return servers.fresh_topology()


@pytest_asyncio.fixture
async def database_url(postgres_url: str) -> AsyncIterator[str]:
    url = await servers.create_database(postgres_url)
    yield url
    await servers.drop_database(postgres_url, url)


@pytest_asyncio.fixture
async def nc(nats_url: str, topology: Topology) -> AsyncIterator[NATS]:
    client = await connection.connect(nats_url, "suzumio-test")
    await ensure_streams(client, topology.streams())
    yield client
    await client.close()


@pytest_asyncio.fixture
async def store(nc: NATS, topology: Topology) -> EventStore:
    return EventStore(nc, topology)


@pytest_asyncio.fixture
async def pool(database_url: str) -> AsyncIterator[Pool]:
    created = await db.create_pool(database_url, "suzumio-test", max_size=5)
    await apply_migrations(created, platform_migrations())
    yield created
    await created.close()


@pytest_asyncio.fixture
async def commands(nc: NATS, topology: Topology) -> CommandClient:
    return CommandClient(nc, topology, timeout=5.0)
