from __future__ import annotations

import asyncio

import pytest

from suzumio.platform.db import pool as db
from suzumio.platform.db.migrations import (
    Migration,
    MigrationError,
    apply_migrations,
    platform_migrations,
)
from suzumio.platform.db.pool import Pool

EXTRA = (
    Migration("test/0001_things.sql", "CREATE TABLE things (id int PRIMARY KEY);"),
    Migration("test/0002_more.sql", "ALTER TABLE things ADD COLUMN name text;"),
)


async def test_migrations_apply_once_in_order(pool: Pool) -> None:
    assert await apply_migrations(pool, EXTRA) == [m.name for m in EXTRA]
    assert await apply_migrations(pool, EXTRA) == []
    assert await apply_migrations(pool, platform_migrations()) == []  # the fixture applied them
    columns = await pool.fetch(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'things'"
    )
    assert {r["column_name"] for r in columns} == {"id", "name"}


async def test_concurrent_starts_apply_each_migration_once(database_url: str) -> None:
    pools = [await db.create_pool(database_url, f"starter-{i}", max_size=2) for i in range(5)]
    try:
        results = await asyncio.gather(*(apply_migrations(p, EXTRA) for p in pools))
    finally:
        await asyncio.gather(*(p.close() for p in pools))
    applied = [name for result in results for name in result]
    assert sorted(applied) == sorted(m.name for m in EXTRA)


async def test_an_edited_migration_is_refused(pool: Pool) -> None:
    await apply_migrations(pool, EXTRA)
    edited = (EXTRA[0], Migration(EXTRA[1].name, "ALTER TABLE things ADD COLUMN other text;"))
    with pytest.raises(MigrationError, match="changed after it was applied"):
        await apply_migrations(pool, edited)


async def test_a_failing_migration_changes_nothing(pool: Pool) -> None:
    broken = (Migration("test/0009_broken.sql", "CREATE TABLE half (id int); SELECT 1/0;"),)
    with pytest.raises(Exception, match="division by zero"):
        await apply_migrations(pool, broken)
    assert await pool.fetchval("SELECT to_regclass('public.half')") is None
    names = await pool.fetch("SELECT name FROM suzumio.schema_migrations")
    assert "test/0009_broken.sql" not in {r["name"] for r in names}
