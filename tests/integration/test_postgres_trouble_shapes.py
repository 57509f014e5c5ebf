"""`is_postgres_trouble` on the errors the installed asyncpg really raises, against a real
Postgres: a connection the server ended (mid-statement, inside a transaction, or while it lay
idle and then used) is trouble; a connection used by two tasks at once, one used after its
release to the pool, arguments miscounted or mistyped are bugs of ours. It tells some of them
by asyncpg's messages, which a new asyncpg could word otherwise: this says so if it does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable

import asyncpg
import pytest
import pytest_asyncio

from suzumio.platform.db import pool as db
from suzumio.platform.db.pool import Connection, Pool
from suzumio.platform.db.trouble import is_postgres_trouble


@pytest_asyncio.fixture
async def conn(database_url: str) -> AsyncIterator[Connection]:
    single = await db.connect(database_url, "suzumio-test-trouble")
    yield single
    await single.close()


async def cut(pool: Pool, conn: Connection) -> None:
    """The server ends `conn`'s session, as a restart or an operator does."""
    assert await pool.fetchval("SELECT pg_terminate_backend($1)", conn.get_server_pid())


async def raised(work: Awaitable[object]) -> BaseException:
    with pytest.raises(Exception) as caught:  # noqa: PT011 - which one is what is looked at
        await work
    return caught.value


async def running_on(pool: Pool, conn: Connection) -> None:
    """Until the server runs a statement on `conn` (a cut before it was sent fails otherwise)."""
    for _ in range(500):
        state = await pool.fetchval(
            "SELECT state FROM pg_stat_activity WHERE pid = $1", conn.get_server_pid()
        )
        if state == "active":
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the statement never ran")


async def test_a_connection_cut_mid_statement_is_trouble(pool: Pool, conn: Connection) -> None:
    running = asyncio.create_task(conn.fetchval("SELECT pg_sleep(30)"))
    await running_on(pool, conn)
    await cut(pool, conn)
    exc = await raised(running)
    assert isinstance(exc, asyncpg.ConnectionDoesNotExistError), repr(exc)
    assert is_postgres_trouble(exc)


async def test_a_transaction_whose_connection_is_cut_is_trouble(
    pool: Pool, conn: Connection
) -> None:
    async def work() -> None:
        async with conn.transaction():
            await conn.execute("SELECT 1")
            running = asyncio.create_task(conn.fetchval("SELECT pg_sleep(30)"))
            await running_on(pool, conn)
            await cut(pool, conn)
            await running

    exc = await raised(work())  # the rollback's failure on the closed connection, here
    assert is_postgres_trouble(exc), repr(exc)


async def test_a_connection_cut_while_idle_then_used_is_trouble(
    pool: Pool, conn: Connection
) -> None:
    ended = asyncio.Event()
    conn.add_termination_listener(lambda _: ended.set())
    await cut(pool, conn)
    await asyncio.wait_for(ended.wait(), 10)
    for use in (conn.fetchval("SELECT 1"), conn.execute("SELECT 1")):
        exc = await raised(use)
        assert isinstance(exc, asyncpg.InterfaceError), repr(exc)
        assert is_postgres_trouble(exc), repr(exc)


async def test_a_connection_used_by_two_tasks_at_once_is_a_bug(conn: Connection) -> None:
    both = await asyncio.gather(
        conn.fetchval("SELECT pg_sleep(0.2)"), conn.fetchval("SELECT 1"), return_exceptions=True
    )
    [exc] = [e for e in both if isinstance(e, BaseException)]
    assert isinstance(exc, asyncpg.InterfaceError), repr(exc)
    assert "another operation is in progress" in str(exc)
    assert not is_postgres_trouble(exc)


async def test_a_connection_used_after_its_release_is_a_bug(pool: Pool) -> None:
    async with pool.acquire() as released:
        pass

    async def use() -> object:
        return await released.fetchval("SELECT 1")

    exc = await raised(use())
    assert isinstance(exc, asyncpg.InterfaceError), repr(exc)
    assert not is_postgres_trouble(exc)


async def test_arguments_miscounted_or_mistyped_are_a_bug(pool: Pool) -> None:
    miscounted = await raised(pool.fetchval("SELECT $1::int", 1, 2))
    assert isinstance(miscounted, asyncpg.InterfaceError), repr(miscounted)
    mistyped = await raised(pool.fetchval("SELECT $1::int", "seven"))
    assert isinstance(mistyped, asyncpg.DataError), repr(mistyped)
    assert not is_postgres_trouble(miscounted)
    assert not is_postgres_trouble(mistyped)
