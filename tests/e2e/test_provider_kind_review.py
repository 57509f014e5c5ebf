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


async def test_a_key_no_header_can_carry_is_refused_when_it_is_set(stack: Stack) -> None:
    """A provider key goes in an HTTP header: one with a pasted line break, a space or a
    character that is not ASCII would fail every call with it (the runner's and the relay's
    alike), so it is a 422 when it is set, and nothing is stored."""
    world = await new_world(stack, "kit")
    base = f"/v1/projects/{world.project_id}/providers"
    body = {"base_url": "https://api.openai.example/v1", "model": "m"}
    async with stack.client(world.key) as c:
        for key in ("sk-pasted\n", "sk with space", "sk-café"):
            refused = problem(
                await c.put(f"{base}/p", json={**body, "api_key": key}), 422, "invalid"
            )
            assert "printable ASCII" in str(refused), refused
            assert key not in str(refused)  # a refused key is not echoed back
        assert ok(await c.get(base)) == []
        ok(await c.put(f"{base}/p", json={**body, "api_key": "sk-AZaz09_-.~+/="}))
        assert [p["api_key_set"] for p in ok(await c.get(base))] == [True]
