"""Security review, across the platform's seams: a revoked key gets no kept answer replayed
(it was, for 24 hours: here a live key's secret), and a provider's URL never carries (nor
shows every viewer) credentials."""

from __future__ import annotations

from tests.e2e.api import new_world, ok
from tests.e2e.stack import Stack


async def test_a_revoked_key_gets_no_replayed_answer(stack: Stack) -> None:
    w = await new_world(stack, "revoked")
    async with stack.client(w.key) as c:
        first = await c.post(
            "/v1/me/api-keys", json={"name": "second"}, headers={"Idempotency-Key": "k-1"}
        )
        second = ok(first, 201)["api_key"]
    async with stack.client(second) as c:
        # The gateway that revokes a key forgets it at once (one gateway here).
        revoked = await c.delete(f"/v1/me/api-keys/{w.key.split('_')[1]}")
        assert revoked.status_code == 204
    async with stack.client(w.key) as c:
        assert (await c.get("/v1/me")).status_code == 401
        again = await c.post(
            "/v1/me/api-keys", json={"name": "second"}, headers={"Idempotency-Key": "k-1"}
        )
    assert again.status_code == 401, again.text  # not 201 with `second` in the body


async def test_credentials_in_a_providers_url_are_never_shown(stack: Stack) -> None:
    w = await new_world(stack, "provurl")
    url = "https://user:pa55word@proxy.example/v1"
    async with stack.client(w.key) as c:
        answer = await c.put(
            f"/v1/projects/{w.project_id}/providers/p1", json={"base_url": url, "model": "m"}
        )
        listed = await c.get(f"/v1/projects/{w.project_id}/providers")
    # Either refused (422), or kept out of what the API shows.
    assert answer.status_code == 422 or "pa55word" not in answer.text
    assert "pa55word" not in listed.text
