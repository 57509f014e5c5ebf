"""SQL migrations: numbered files applied once each, in order, under an advisory lock.

Every service applies the migrations it knows at start; the lock makes concurrent starts
harmless and the checksum makes an edited, already-applied migration an error instead of a
silent divergence.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

from suzumio.platform.db.pool import Pool
from suzumio.platform.logging import get_logger

log = get_logger(__name__)

MIGRATION_LOCK = 0x5A7A_0001  # advisory lock key shared by every Suzumio process


@dataclass(frozen=True, slots=True)
class Migration:
    name: str  # "<component>/<file>", e.g. "platform/0001_init.sql"
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


class MigrationError(RuntimeError):
    pass


def load_migrations(
    package: str, component: str, folder_name: str = "sql"
) -> tuple[Migration, ...]:
    """The `*.sql` files in the `folder_name` folder of `package`, ordered by name."""
    folder = resources.files(package) / folder_name
    files = sorted((f for f in folder.iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)
    return tuple(Migration(f"{component}/{f.name}", f.read_text()) for f in files)


def platform_migrations() -> tuple[Migration, ...]:
    return load_migrations("suzumio.platform.db", "platform")


_BOOTSTRAP = """
CREATE SCHEMA IF NOT EXISTS suzumio;
CREATE TABLE IF NOT EXISTS suzumio.schema_migrations (
    name text PRIMARY KEY,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
"""


async def apply_migrations(pool: Pool, migrations: tuple[Migration, ...]) -> list[str]:
    """Apply the ones not applied yet; returns their names."""
    applied: list[str] = []
    async with pool.acquire() as conn:
        await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK)
        try:
            await conn.execute(_BOOTSTRAP)
            rows = await conn.fetch("SELECT name, checksum FROM suzumio.schema_migrations")
            done = {r["name"]: r["checksum"] for r in rows}
            for migration in migrations:
                if migration.name in done:
                    if done[migration.name] != migration.checksum:
                        raise MigrationError(f"{migration.name} changed after it was applied")
                    continue
                async with conn.transaction():
                    await conn.execute(migration.sql)
                    await conn.execute(
                        "INSERT INTO suzumio.schema_migrations (name, checksum) VALUES ($1, $2)",
                        migration.name,
                        migration.checksum,
                    )
                applied.append(migration.name)
                log.info("migration.applied", migration=migration.name)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK)
    return applied
