"""Review of the gateway's REST routes, through HTTP against the session service and the
gateway on the test servers: cursors and uploads that must be a 4xx problem (not a 500, not
a silent wrong result), downloads typed as stored, API keys named after an Idempotency-Key,
and writes whose read models lag that still say where they are in the log."""

from __future__ import annotations

import base64
import json

from suzumio.contracts.ids import new_id
from suzumio.gateway.bootstrap import IDEMPOTENCY_BUCKET
from tests.e2e.api import new_world, ok, problem, read_models_held
from tests.e2e.stack import Stack


def _cursor(value: object, row_id: str) -> str:
    raw = json.dumps([value, row_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


async def test_a_message_cursor_past_what_a_version_column_holds_is_422(stack: Stack) -> None:
    world = await new_world(stack, "int32")
    url = f"/v1/sessions/{world.session_id}/messages"
    async with stack.client(world.key) as c:
        ok(await c.post(url, json={"text": "hello"}), 201)
        for value in (2**31, -(2**31) - 1, 2**40):
            problem(await c.get(url, params={"cursor": _cursor(value, "x")}), 422, "invalid")


async def test_a_cursor_naming_a_row_in_text_postgres_cannot_take_is_422(stack: Stack) -> None:
    # JSON's "\\ud800" decodes to a lone surrogate, which no database text can hold.
    world = await new_world(stack, "surrogate")
    async with stack.client(world.key) as c:
        url = f"/v1/sessions/{world.session_id}/messages"
        problem(await c.get(url, params={"cursor": _cursor(1, "\ud800")}), 422, "invalid")
    async with stack.client(world.key) as c:  # a 500 would have closed the connection
        stamp = "2030-01-01T00:00:00+00:00"
        url = f"/v1/projects/{world.project_id}/sessions"
        problem(await c.get(url, params={"cursor": _cursor(stamp, "a\udc80")}), 422, "invalid")


def _part(filename: bytes) -> bytes:
    return (
        b'--XX\r\nContent-Disposition: form-data; name="file"; filename="'
        + filename
        + b'"\r\nContent-Type: text/plain\r\n\r\nhi\r\n'
    )


async def test_a_file_name_that_is_not_utf8_is_refused_and_stores_nothing(stack: Stack) -> None:
    world = await new_world(stack, "latin1")
    url = f"/v1/projects/{world.project_id}/artifacts"
    async with stack.client(world.key) as c:
        body = _part(b"ok.txt") + _part(b"caf\xe9.txt") + b"--XX--\r\n"
        refused = await c.post(
            url, content=body, headers={"content-type": "multipart/form-data; boundary=XX"}
        )
        problem(refused, 422, "invalid")
        assert ok(await c.get(url))["items"] == []
        body = _part("café.txt".encode()) + b"--XX--\r\n"
        stored = await c.post(
            url, content=body, headers={"content-type": "multipart/form-data; boundary=XX"}
        )
        assert [a["path"] for a in ok(stored, 201)["items"]] == ["café.txt"]


async def test_a_key_retry_whose_first_answer_was_lost_makes_no_second_key(stack: Stack) -> None:
    world = await new_world(stack, "keyretry")
    kv = await stack.nc.jetstream().key_value(stack.topology.bucket(IDEMPOTENCY_BUCKET))
    headers = {"Idempotency-Key": f"k-{new_id()}"}
    async with stack.client(world.key) as c:
        before = ok(await c.get("/v1/me/api-keys"))
        first = ok(await c.post("/v1/me/api-keys", json={"name": "ci"}, headers=headers), 201)
        replay = await c.post("/v1/me/api-keys", json={"name": "ci"}, headers=headers)
        assert ok(replay, 201)["api_key"] == first["api_key"]
        for key in await kv.keys():  # as if the gateway died before it kept the answer
            await kv.delete(key)
        problem(
            await c.post("/v1/me/api-keys", json={"name": "ci"}, headers=headers), 409, "conflict"
        )
        keys = ok(await c.get("/v1/me/api-keys"))
    assert len(keys) == len(before) + 1
    async with stack.client(first["api_key"]) as c:  # the key the first answer showed works
        assert ok(await c.get("/v1/me"))["id"] == world.user_id


async def test_a_download_has_the_type_the_artifact_was_stored_with(stack: Stack) -> None:
    world = await new_world(stack, "charset")
    latin1 = "café\n".encode("latin-1")
    async with stack.client(world.key) as c:
        stored = await c.post(
            f"/v1/projects/{world.project_id}/artifacts",
            files=[("file", ("notes.txt", latin1, "text/plain"))],
        )
        artifact = ok(stored, 201)["items"][0]
        assert artifact["content_type"] == "text/plain"
        got = await c.get(f"/v1/artifacts/{artifact['id']}/content")
    assert got.status_code == 200
    assert got.content == latin1
    assert got.headers["content-type"] == "text/plain"  # no charset nobody declared


async def test_a_write_the_read_models_lag_behind_still_says_its_position(stack: Stack) -> None:
    """A 504 after the write happened must still tell where it is in the log."""
    world = await new_world(stack, "lagging")
    async with stack.client(world.key) as c:
        async with read_models_held(stack):
            closing = await c.post(f"/v1/sessions/{world.session_id}/close", json={})
            renaming = await c.patch(f"/v1/projects/{world.project_id}", json={"name": "n"})
            uploading = await c.post(
                f"/v1/projects/{world.project_id}/artifacts",
                files=[("file", ("a.txt", b"a", "text/plain"))],
            )
        for lagged in (closing, renaming, uploading):
            problem(lagged, 504, "timeout")
        position = max(int(r.headers["suzumio-position"]) for r in (closing, uploading))
        params = {"min_position": str(position)}
        session = ok(await c.get(f"/v1/sessions/{world.session_id}", params=params))
        assert session["status"] == "closed"
        listed = ok(await c.get(f"/v1/projects/{world.project_id}/artifacts", params=params))
        assert [a["path"] for a in listed["items"]] == ["a.txt"]
        assert int(renaming.headers["suzumio-position"]) > 0


async def test_a_key_the_lagging_read_model_has_not_shown_yet_is_unavailable_not_invalid(
    stack: Stack,
) -> None:
    """A key made a moment ago, while the keys' read model stands still (the projector's
    checkpoint held here) past the read-your-writes wait: the gateway cannot tell yet — a 503
    to try again, not a 401 telling the client its good key is wrong. Once it caught up, the
    key works."""
    async with stack.client(stack.admin_key) as admin, read_models_held(stack):
        body = {"name": "fresh", "email": "fresh@x.io"}
        made = ok(await admin.post("/v1/users", json=body), 201)
        async with stack.client(made["api_key"]) as c:
            early = await c.get("/v1/me")
    problem(early, 503, "unavailable")
    assert early.headers["retry-after"] == "1"
    async with stack.client(made["api_key"]) as c:
        assert ok(await c.get("/v1/me"))["id"] == made["id"]
    async with stack.client("szm_" + "x" * 40) as c:  # and a wrong key is still a 401
        problem(await c.get("/v1/me"), 401, "unauthenticated")


async def test_a_create_the_read_models_lag_behind_still_says_what_it_made(stack: Stack) -> None:
    """A new user's or key's secret is in the create's answer only: while the read models lag
    it is answered from the command (201), not lost in a 504 (the key existed, and no retry
    could ever show it). Other creates say what they made in the 504 (`Location`)."""
    world = await new_world(stack, "lagmaker")
    async with stack.client(stack.admin_key) as admin, stack.client(world.key) as c:
        async with read_models_held(stack):
            user = await admin.post("/v1/users", json={"name": "late", "email": "l@x.io"})
            key = await c.post("/v1/me/api-keys", json={"name": "ci"})
            session = await c.post(
                f"/v1/projects/{world.project_id}/sessions", json={"agent_id": world.agent_id}
            )
        made = ok(user, 201)
        assert (made["name"], made["email"], made["admin"]) == ("late", "l@x.io", False)
        assert user.headers["location"] == f"/v1/users/{made['id']}"
        second = ok(key, 201)
        assert (second["name"], second["revoked_at"]) == ("ci", None)
        problem(session, 504, "timeout")
        assert session.headers["location"].startswith("/v1/sessions/")
        position = str(max(int(r.headers["suzumio-position"]) for r in (user, key, session)))
        opened = ok(await c.get(session.headers["location"], params={"min_position": position}))
        assert opened["agent_id"] == world.agent_id
    # The secrets shown work.
    for secret in (made["api_key"], second["api_key"]):
        async with stack.client(secret) as c:
            ok(await c.get("/v1/me", params={"min_position": position}))


async def test_an_upload_cut_off_between_parts_or_with_a_boundary_past_limits_is_422(
    stack: Stack,
) -> None:
    world = await new_world(stack, "cutparts")
    url = f"/v1/projects/{world.project_id}/artifacts"
    form = "multipart/form-data; boundary=XX"
    async with stack.client(world.key) as c:
        # Cut after the first part's boundary: the second file never came. Taking the first
        # as the whole upload would store a part of what was sent as if it were all.
        cut = _part(b"one.txt") + b"--XX\r\n"
        problem(await c.post(url, content=cut, headers={"content-type": form}), 422, "invalid")
        boundary = "b" * 300  # the parser refuses it as it is made: was a 500
        body = f"--{boundary}--\r\n".encode()
        long = {"content-type": f"multipart/form-data; boundary={boundary}"}
        problem(await c.post(url, content=body, headers=long), 422, "invalid")
    async with stack.client(world.key) as c:
        assert ok(await c.get(url))["items"] == []
        whole = _part(b"one.txt") + b"--XX--\r\n"
        stored = await c.post(url, content=whole, headers={"content-type": form})
        assert [a["path"] for a in ok(stored, 201)["items"]] == ["one.txt"]
