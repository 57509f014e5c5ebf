"""API keys while their read model (`users`) is not serving — rebuilt for a new version, or
left to a later release mid-upgrade: its tables are frozen, and a key revoked since still
showed usable there, so it kept working until the swap. The gateway now checks a key it
finds there against the log (through the session service) while the model is frozen."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from suzumio.platform.db import pool as db
from suzumio.platform.projections.positions import CHANNEL
from tests.e2e.api import new_user, ok, problem
from tests.e2e.stack import Stack, running_stack


@pytest_asyncio.fixture(scope="module")
async def own_stack(
    nats_url: str, postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    """A stack of its own: its keys' read model is frozen for good."""
    tmp = Path(tmp_path_factory.mktemp("frozen-keys"))
    async with running_stack(nats_url, postgres_url, tmp) as s:
        yield s


async def _freeze_the_keys_read_model(stack: Stack) -> None:
    """As a later release's rebuild leaves it while that release is around: of a version
    this code cannot apply to, not serving; the running projector leaves it alone."""
    conn = await db.connect(stack.database_url, "test-freeze")
    try:
        version = await conn.fetchval(
            "UPDATE suzumio.projection_checkpoints SET version = version + 1, serving = false"
            " WHERE name = 'users' RETURNING version"
        )
        await conn.execute(  # around for as long as the test runs
            "INSERT INTO suzumio.projector_presence (name, version, seen_at)"
            " VALUES ('users', $1, now() + interval '1 hour')",
            version,
        )
        await conn.execute("SELECT pg_notify($1, '0')", CHANNEL)  # the gateway reads it now
    finally:
        await conn.close()


async def test_a_key_revoked_while_the_keys_read_model_is_frozen_stops_working(
    own_stack: Stack,
) -> None:
    stack = own_stack
    revoked, revoked_user = await new_user(stack, "leaving")
    kept, kept_user = await new_user(stack, "staying")
    async with stack.client(revoked) as c:
        [key] = ok(await c.get("/v1/me/api-keys"))
    await _freeze_the_keys_read_model(stack)

    async with stack.client(kept) as c:  # a good key still opens the API
        assert ok(await c.get("/v1/me"))["id"] == kept_user
    async with stack.client(revoked) as c:
        assert ok(await c.get("/v1/me"))["id"] == revoked_user
        ok(await c.delete(f"/v1/me/api-keys/{key['key_id']}"), 204)
        problem(await c.get("/v1/me"), 401, "unauthenticated")

    # The refusal came from the log: the frozen read model still shows the key usable.
    conn = await db.connect(stack.database_url, "test-frozen")
    try:
        row = await conn.fetchrow(
            "SELECT c.serving, k.revoked_at IS NULL AS usable"
            " FROM suzumio.projection_checkpoints c, proj_users.api_keys k"
            " WHERE c.name = 'users' AND k.key_id = $1",
            key["key_id"],
        )
    finally:
        await conn.close()
    assert row is not None
    assert (row["serving"], row["usable"]) == (False, True)
