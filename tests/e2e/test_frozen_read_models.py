"""Who may do what while a read model is not serving — rebuilt for a new version, or left to
a later release mid-upgrade: its tables are frozen. A key revoked since (`users`) still
showed usable there, and a member removed since (`projects`) still a member, until the swap.
The gateway now asks the log (through the session service) while the model is frozen."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from suzumio.contracts.events import ToolCallStarted
from suzumio.platform.db import pool as db
from suzumio.platform.projections.positions import CHANNEL
from tests.e2e.api import in_pages, new_user, new_world, ok, problem
from tests.e2e.runner_env import request_activation
from tests.e2e.stack import Stack, running_stack
from tests.e2e.test_cli_agents import cli, reviewer_package


@pytest_asyncio.fixture
async def own_stack(
    nats_url: str, postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    """A stack of each test's own: a read model of it is frozen for good."""
    tmp = Path(tmp_path_factory.mktemp("frozen"))
    async with running_stack(nats_url, postgres_url, tmp) as s:
        yield s


async def _freeze(stack: Stack, projection: str) -> None:
    """As a later release's rebuild leaves it while that release is around: of a version
    this code cannot apply to, not serving; the running projector leaves it alone."""
    conn = await db.connect(stack.database_url, "test-freeze")
    try:
        version = await conn.fetchval(
            "UPDATE suzumio.projection_checkpoints SET version = version + 1, serving = false"
            " WHERE name = $1 RETURNING version",
            projection,
        )
        await conn.execute(  # around for as long as the test runs
            "INSERT INTO suzumio.projector_presence (name, version, seen_at)"
            " VALUES ($1, $2, now() + interval '1 hour')",
            projection,
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
    await _freeze(stack, "users")

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


async def test_a_member_removed_while_the_projects_read_model_is_frozen_loses_access(
    own_stack: Stack,
) -> None:
    stack = own_stack
    world = await new_world(stack, "owner")
    reader_key, reader = await new_user(stack, "reader")
    async with stack.client(world.key) as owner:
        put = f"/v1/projects/{world.project_id}/members/{reader}"
        ok(await owner.put(put, json={"role": "viewer"}))
    async with stack.client(reader_key) as c:
        ok(await c.get(f"/v1/projects/{world.project_id}"))
        ok(await c.get(f"/v1/sessions/{world.session_id}"))
    await _freeze(stack, "projects")

    joiner_key, joiner = await new_user(stack, "joiner")
    async with stack.client(reader_key) as c:  # still a member: the log says so
        ok(await c.get(f"/v1/projects/{world.project_id}"))
    async with stack.client(world.key) as owner:
        ok(await owner.delete(f"/v1/projects/{world.project_id}/members/{reader}"), 204)
        put = f"/v1/projects/{world.project_id}/members/{joiner}"
        ok(await owner.put(put, json={"role": "member"}))
    async with stack.client(reader_key) as c:
        problem(await c.get(f"/v1/projects/{world.project_id}"), 404, "not_found")
        problem(await c.get(f"/v1/sessions/{world.session_id}"), 404, "not_found")
        assert ok(await c.get("/v1/projects"))["items"] == []  # nor listed
    async with stack.client(joiner_key) as c:  # added since: the frozen tables miss them
        assert ok(await c.get(f"/v1/projects/{world.project_id}"))["role"] == "member"
        ok(await c.get(f"/v1/sessions/{world.session_id}"))
    async with stack.client(world.key) as owner:  # the owner still is
        ok(await owner.get(f"/v1/sessions/{world.session_id}"))

    conn = await db.connect(stack.database_url, "test-frozen")
    try:  # the refusals came from the log: the frozen read model still shows the member
        row = await conn.fetchrow(
            "SELECT c.serving, m.role FROM suzumio.projection_checkpoints c"
            " LEFT JOIN proj_projects.members m ON m.project_id = $1 AND m.user_id = $2"
            " WHERE c.name = 'projects'",
            world.project_id,
            reader,
        )
    finally:
        await conn.close()
    assert row is not None
    assert (row["serving"], row["role"]) == (False, "viewer")


async def test_a_key_revoked_while_the_keys_read_model_is_frozen_gets_no_kept_answer(
    own_stack: Stack,
) -> None:
    """A POST's answer kept for its Idempotency-Key is replayed only to a key that still
    opens the API: asked of the log too while the keys' read model is frozen (before, the
    frozen tables alone were read, and a revoked key got its new key's secret again)."""
    stack = own_stack
    revoked, _ = await new_user(stack, "replayer")
    headers = {"Idempotency-Key": "make-a-key"}
    async with stack.client(revoked) as c:
        [key] = ok(await c.get("/v1/me/api-keys"))
        made = ok(await c.post("/v1/me/api-keys", json={"name": "second"}, headers=headers), 201)
        replayed = await c.post("/v1/me/api-keys", json={"name": "second"}, headers=headers)
        assert replayed.headers["idempotent-replayed"] == "true"
        assert ok(replayed, 201)["api_key"] == made["api_key"]
        await _freeze(stack, "users")
        ok(await c.delete(f"/v1/me/api-keys/{key['key_id']}"), 204)
        refused = await c.post("/v1/me/api-keys", json={"name": "second"}, headers=headers)
    problem(refused, 401, "unauthenticated")
    assert made["api_key"] not in refused.text


async def test_lists_paged_in_the_log_order_still_answer_from_the_tables_before_it(
    own_stack: Stack,
) -> None:
    """Mid-upgrade, until the rebuilt read models are swapped in, the tables are the release
    before's, without the column the tool calls and pending actions are now paged by: the
    lists answer by their times as before, not with a 500."""
    stack = own_stack
    world = await new_world(stack, "beforecols")
    activation_id = await request_activation(stack, world)
    calls = [
        ToolCallStarted(call_id=f"c{i}", tool="file.read", arguments_digest="a" * 64,
                        arguments_size=2)
        for i in range(3)
    ]  # fmt: skip
    await stack.store.append(activation_id, calls, 0)
    url = f"/v1/activations/{activation_id}/tool-calls"
    async with stack.client(world.key) as c:
        await in_pages(c, url, 3)
        conn = await db.connect(stack.database_url, "test-older-tables")
        try:
            await conn.execute("ALTER TABLE proj_tool_calls.tool_calls DROP started_position")
            await conn.execute(
                "ALTER TABLE proj_pending_actions.pending_actions DROP created_position"
            )
        finally:
            await conn.close()
        listed = await in_pages(c, url, 3)
        pending = ok(await c.get(f"/v1/sessions/{world.session_id}/pending-actions"))
    assert [t["call_id"] for t in listed] == ["c0", "c1", "c2"]
    assert pending == {"items": [], "next_cursor": None}


def _made_not_shown(response: httpx.Response, read_model: str) -> dict[str, Any]:
    """A write that was made, whose answer cannot be read back from the frozen `read_model`:
    a 504 that says so and where to read it, not a 404 or 500 (or the state before)."""
    body = problem(response, 504, "timeout")
    assert f"the {read_model} read model is being rebuilt" in body["detail"]
    assert int(response.headers["Suzumio-Position"]) > 0
    return body


async def test_a_write_whose_read_model_is_frozen_says_it_was_made(own_stack: Stack) -> None:
    """A create read back from a frozen read model answered 404 (a session, a project) or
    500 (an upload) for an object it had made, and an update its state before the change."""
    stack = own_stack
    world = await new_world(stack, "writer")
    await _freeze(stack, "sessions")
    await _freeze(stack, "agents")
    await _freeze(stack, "artifacts")
    headers = {"Idempotency-Key": "open-while-frozen"}
    async with stack.client(world.key) as c:
        opened = f"/v1/projects/{world.project_id}/sessions"
        body = {"agent_id": world.agent_id, "title": "made while frozen"}
        first = await c.post(opened, json=body, headers=headers)
        _made_not_shown(first, "sessions")
        location = first.headers["Location"]
        assert location.startswith("/v1/sessions/")
        # Kept for the key: the retry makes no second session, and learns the same place.
        again = await c.post(opened, json=body, headers=headers)
        _made_not_shown(again, "sessions")
        assert again.headers["Location"] == location

        renamed = await c.patch(f"/v1/agents/{world.agent_id}", json={"role": "renamed"})
        _made_not_shown(renamed, "agents")
        uploaded = await c.post(
            f"/v1/projects/{world.project_id}/artifacts",
            files=[("file", ("notes.txt", b"hello", "text/plain"))],
            data={"session_id": world.session_id},
        )
        _made_not_shown(uploaded, "artifacts")
        # A read model that serves answers as ever: the project's.
        ok(await c.patch(f"/v1/projects/{world.project_id}", json={"name": "still served"}))

    # Made, all of them: the log has them.
    conn = await db.connect(stack.database_url, "test-frozen")
    try:
        made = await conn.fetchval(
            "SELECT count(*) FROM proj_sessions.sessions WHERE project_id = $1", world.project_id
        )
    finally:
        await conn.close()
    assert made == 1  # the frozen table has only the session made before the freeze
    events = await stack.store.load("session", location.rsplit("/", 1)[1])
    assert [e.envelope.type for e in events.events][:1] == ["session.opened"]


async def test_an_agent_imported_while_its_read_model_is_frozen_is_told_made(
    own_stack: Stack, tmp_path: Path
) -> None:
    """`suzumio agents import` took the gateway's 504 'made' for a failure (exit 1, no id):
    run again, it imported a second agent."""
    stack = own_stack
    world = await new_world(stack, "importer")
    await _freeze(stack, "agents")
    done = await cli(
        stack,
        world.key,
        "agents",
        "import",
        str(reviewer_package(tmp_path)),
        "--project",
        world.project_id,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    agent_id = done.stdout.strip().rsplit(" ", 1)[-1]
    assert "was made" in done.stderr
    events = await stack.store.load("agent", agent_id)
    assert [e.envelope.type for e in events.events][:1] == ["agent.created"]


async def test_a_keyed_request_refused_for_itself_is_refused_at_once(own_stack: Stack) -> None:
    """A refusal of the request — the session closed — is no earlier attempt's: answered 409
    as ever, not looked for in the read model, which, frozen, made it a 503 that clients
    retried for good."""
    stack = own_stack
    world = await new_world(stack, "closer")
    await _freeze(stack, "sessions")
    async with stack.client(world.key) as c:
        closing = await c.post(f"/v1/sessions/{world.session_id}/close", json={})
        _made_not_shown(closing, "sessions")
        posted = await c.post(
            f"/v1/sessions/{world.session_id}/messages",
            json={"text": "hi"},
            headers={"Idempotency-Key": "to-a-closed-session"},
        )
    assert "closed" in problem(posted, 409, "conflict")["detail"]
