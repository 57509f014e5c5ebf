"""Read models through HTTP: instants at the edge of what the API takes."""

from __future__ import annotations

from datetime import UTC, datetime

from tests.e2e.api import new_user, ok
from tests.e2e.stack import Stack


async def test_a_key_that_expires_at_the_latest_instant_allowed_works(stack: Stack) -> None:
    """9999-12-31T23:59:59.999999Z is in the range the API takes; the driver stored it as
    `infinity` and read it back without a timezone, so checking the key (an aware clock
    against it) failed with a 500 on every request."""
    key, user_id = await new_user(stack, "max")
    async with stack.client(key) as c:
        made = ok(
            await c.post("/v1/me/api-keys", json={"expires_at": "9999-12-31T23:59:59.999999Z"}),
            201,
        )
        expires = datetime.fromisoformat(made["expires_at"])
        assert expires.tzinfo is not None
        assert expires > datetime.now(UTC)
    async with stack.client(made["api_key"]) as c2:
        assert ok(await c2.get("/v1/me"))["id"] == user_id
