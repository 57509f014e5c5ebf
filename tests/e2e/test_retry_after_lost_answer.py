"""A POST retried with its Idempotency-Key after its first answer was lost — its command timed
out after the session service applied it, or the gateway died before keeping the answer —
names the same objects and is refused as existing. It answered 409, and a client (the CLI)
took the request for failed and sent it again under a new key: a second project, a message
the agent answered twice. Such a retry now answers as the first attempt would have, when
what the first attempt made is what the retry asks for; otherwise the 409 stands."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from tests.e2e.api import lose_kept_answer, new_world, ok, problem
from tests.e2e.stack import Stack


async def _answer_lost(
    stack: Stack, send: Callable[[], Awaitable[httpx.Response]], who: str, path: str, key: str
) -> httpx.Response:
    """`send`'s first answer, whose kept copy is then deleted: as a command that timed out
    after it was applied leaves it (its answer is never kept)."""
    first = await send()
    await lose_kept_answer(stack, who, path, key)
    return first


def _key() -> dict[str, str]:
    return {"Idempotency-Key": f"lost-{os.urandom(6).hex()}"}


async def test_a_retry_of_a_made_project_session_or_message_answers_as_the_first(
    stack: Stack,
) -> None:
    world = await new_world(stack, "retrier")
    async with stack.client(world.key) as c:
        calls: list[tuple[str, dict[str, Any], dict[str, Any], int]] = [
            ("/v1/projects", {"name": "twice?"}, {"name": "other"}, 201),
            (
                f"/v1/projects/{world.project_id}/sessions",
                {"agent_id": world.agent_id, "title": "once"},
                {"agent_id": world.agent_id, "title": "another"},
                201,
            ),
            (
                f"/v1/sessions/{world.session_id}/messages",
                {"text": "deploy it"},
                {"text": "something else"},
                201,
            ),
        ]
        for path, body, other, status in calls:
            headers = _key()

            async def post(
                path: str = path, body: dict[str, Any] = body, headers: dict[str, str] = headers
            ) -> httpx.Response:
                return await c.post(path, json=body, headers=headers)

            key = headers["Idempotency-Key"]
            first = ok(await _answer_lost(stack, post, world.key, path, key), status)
            # Lost again: the next may run too.
            again = await _answer_lost(stack, post, world.key, path, key)
            assert again.status_code == status, (path, again.text)
            assert again.json() == first, path  # the same object, the same position
            # The same key with another body names the same ids: that conflict stands.
            problem(await c.post(path, json=other, headers=headers), 409, "conflict")
        projects = ok(await c.get("/v1/projects"))["items"]
        assert sorted(p["name"] for p in projects) == sorted(["retrier's project", "twice?"])
        messages = ok(await c.get(f"/v1/sessions/{world.session_id}/messages"))["items"]
        assert [m["text"] for m in messages].count("deploy it") == 1
