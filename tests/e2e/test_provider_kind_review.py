"""Through the API: a provider of kind `anthropic` (which the runner cannot call yet) is
refused with a 422 problem that says so, and nothing is stored."""

from __future__ import annotations

from tests.e2e.api import new_world, ok, problem
from tests.e2e.stack import Stack


async def test_an_anthropic_provider_is_refused_with_a_clear_problem(stack: Stack) -> None:
    world = await new_world(stack, "kim")
    base = f"/v1/projects/{world.project_id}/providers"
    body = {"kind": "anthropic", "base_url": "https://api.anthropic.com", "model": "claude"}
    async with stack.client(world.key) as c:
        refused = problem(await c.put(f"{base}/claude", json=body), 422, "invalid")
        assert "not supported yet" in refused["detail"], refused
        assert ok(await c.get(base)) == []
        ok(await c.put(f"{base}/claude", json={**body, "kind": "openai"}))
