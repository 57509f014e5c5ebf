"""Users, API keys, projects, members, runtime profiles and providers through HTTP."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from suzumio.gateway.api.pagination import encode_cursor
from tests.e2e.api import new_user, new_world, ok, problem
from tests.e2e.stack import Stack


async def test_admin_creates_users_whose_keys_work_until_revoked(stack: Stack) -> None:
    key, user_id = await new_user(stack, "ada")
    async with stack.client(key) as c:
        assert ok(await c.get("/v1/me"))["id"] == user_id
        extra = ok(await c.post("/v1/me/api-keys", json={"name": "ci"}), 201)
        assert extra["api_key"].startswith("szm_")
        keys = ok(await c.get("/v1/me/api-keys"))
        assert {k["key_id"] for k in keys} >= {extra["key_id"]}
        assert all("api_key" not in k and "digest" not in k for k in keys)
    async with stack.client(extra["api_key"]) as c2:
        assert ok(await c2.get("/v1/me"))["id"] == user_id
        ok(await c2.delete(f"/v1/me/api-keys/{extra['key_id']}"), 204)
        problem(await c2.get("/v1/me"), 401, "unauthenticated")


@pytest.mark.parametrize(
    "expires_at",
    [
        "0001-01-01T00:00:00+01:00",  # before the year 1 once in UTC: could not be projected
        "9999-12-31T23:00:00-05:00",  # after the year 9999 once in UTC
        "2099-01-01T00:00:00",  # no timezone: whose clock?
        "2001-01-01T00:00:00Z",  # expired already
    ],
)
async def test_a_key_expiry_out_of_range_or_past_is_refused_and_changes_nothing(
    stack: Stack, expires_at: str
) -> None:
    key, _ = await new_user(stack, "eve")
    async with stack.client(key) as c:
        before = ok(await c.get("/v1/me/api-keys"))
        body = problem(
            await c.post("/v1/me/api-keys", json={"expires_at": expires_at}), 422, "invalid"
        )
        assert "expires_at" in str(body)
        assert ok(await c.get("/v1/me/api-keys")) == before
        # The projections still move: a valid key made after it is there to read.
        later = ok(await c.post("/v1/me/api-keys", json={"name": "after"}), 201)
        assert later["key_id"] in {k["key_id"] for k in ok(await c.get("/v1/me/api-keys"))}


async def test_a_key_stops_working_once_it_expires(stack: Stack) -> None:
    key, user_id = await new_user(stack, "fay")
    soon = datetime.now(UTC) + timedelta(seconds=3)
    async with stack.client(key) as c:
        made = ok(await c.post("/v1/me/api-keys", json={"expires_at": soon.isoformat()}), 201)
        assert datetime.fromisoformat(made["expires_at"]) == soon
    async with stack.client(made["api_key"]) as short:
        assert ok(await short.get("/v1/me"))["id"] == user_id
        await asyncio.sleep(max((soon - datetime.now(UTC)).total_seconds(), 0) + 0.2)
        problem(await short.get("/v1/me"), 401, "unauthenticated")


async def test_authentication_errors(stack: Stack) -> None:
    async with stack.client() as anonymous:
        response = await anonymous.get("/v1/me")
        problem(response, 401, "unauthenticated")
        assert response.headers["www-authenticate"] == "Bearer"
    for bad in ("szm_nope_0000000000000000000000", "not-a-key", stack.admin_key[:-2] + "xx"):
        async with stack.client(bad) as c:
            problem(await c.get("/v1/me"), 401, "unauthenticated")
    async with stack.client() as c:
        ok(await c.get("/v1/me", headers={"X-API-Key": stack.admin_key}))


async def test_only_admins_manage_users(stack: Stack) -> None:
    key, _ = await new_user(stack, "bob")
    async with stack.client(key) as c:
        problem(await c.post("/v1/users", json={"name": "mallory"}), 403, "forbidden")
        problem(await c.get("/v1/users"), 403, "forbidden")
    async with stack.client(stack.admin_key) as admin:
        problem(await admin.post("/v1/users", json={"name": ""}), 422, "invalid")
        problem(await admin.post("/v1/users", json={"name": "x", "role": "god"}), 422, "invalid")
        problem(await admin.get("/v1/users/nobody-here"), 404, "not_found")


async def test_project_lifecycle_and_paging(stack: Stack) -> None:
    key, user_id = await new_user(stack, "carol")
    async with stack.client(key) as c:
        ids = [
            ok(await c.post("/v1/projects", json={"name": f"p{i}"}), 201)["id"] for i in range(5)
        ]
        first = ok(await c.get("/v1/projects", params={"limit": 2}))
        assert len(first["items"]) == 2
        seen = [p["id"] for p in first["items"]]
        cursor = first["next_cursor"]
        while cursor:
            page = ok(await c.get("/v1/projects", params={"limit": 2, "cursor": cursor}))
            seen += [p["id"] for p in page["items"]]
            cursor = page["next_cursor"]
        assert sorted(seen) == sorted(ids)
        assert seen == ids[::-1]  # newest first
        project = ok(
            await c.patch(
                f"/v1/projects/{ids[0]}",
                json={"name": "renamed", "limits": {"max_concurrent_activations": 3}},
            )
        )
        assert (project["name"], project["limits"]["max_concurrent_activations"]) == ("renamed", 3)
        assert project["owner_id"] == user_id
        assert project["role"] == "owner"
        problem(await c.get("/v1/projects", params={"cursor": "garbage!"}), 422, "invalid")
        for forged in ([2**70, "x"], [7, "x"], ["2026-01-01T00:00:00", "x"], [None, "x"]):
            problem(
                await c.get("/v1/projects", params={"cursor": encode_cursor(*forged)}),
                422,
                "invalid",
            )
        problem(await c.get("/v1/projects/does-not-exist"), 404, "not_found")
        problem(await c.post("/v1/projects", json={"name": "x", "extra": 1}), 422, "invalid")
        problem(
            await c.patch(
                f"/v1/projects/{ids[0]}", json={"limits": {"max_concurrent_activations": 0}}
            ),
            422,
            "invalid",
        )


async def test_members_and_roles(stack: Stack) -> None:
    owner = await new_world(stack, "dora")
    member_key, member_id = await new_user(stack, "eve")
    pid = owner.project_id
    async with stack.client(owner.key) as c, stack.client(member_key) as m:
        problem(await m.get(f"/v1/projects/{pid}"), 404, "not_found")
        added = ok(await c.put(f"/v1/projects/{pid}/members/{member_id}", json={"role": "viewer"}))
        assert added["role"] == "viewer"
        assert ok(await m.get(f"/v1/projects/{pid}"))["role"] == "viewer"
        # A viewer reads but may not write.
        problem(
            await m.post(f"/v1/projects/{pid}/sessions", json={"agent_id": owner.agent_id}),
            403,
            "forbidden",
        )
        ok(await c.put(f"/v1/projects/{pid}/members/{member_id}", json={"role": "member"}))
        ok(await m.post(f"/v1/projects/{pid}/sessions", json={"agent_id": owner.agent_id}), 201)
        # Members may not manage members; the last owner may not leave.
        problem(
            await m.put(f"/v1/projects/{pid}/members/{member_id}", json={"role": "owner"}),
            403,
            "forbidden",
        )
        problem(await c.delete(f"/v1/projects/{pid}/members/{owner.user_id}"), 409, "conflict")
        # An admin manages members, but owners are the owners' to make and remove.
        ok(await c.put(f"/v1/projects/{pid}/members/{member_id}", json={"role": "admin"}))
        for attempt in (
            m.put(f"/v1/projects/{pid}/members/{member_id}", json={"role": "owner"}),
            m.delete(f"/v1/projects/{pid}/members/{owner.user_id}"),
        ):
            problem(await attempt, 403, "forbidden")
        ok(await c.put(f"/v1/projects/{pid}/members/{member_id}", json={"role": "member"}))
        problem(
            await c.put(f"/v1/projects/{pid}/members/nobody", json={"role": "member"}),
            404,
            "not_found",
        )
        members = ok(await c.get(f"/v1/projects/{pid}/members"))
        assert {(x["user_id"], x["role"]) for x in members} == {
            (owner.user_id, "owner"),
            (member_id, "member"),
        }
        # Leaving needs no rights.
        ok(await m.delete(f"/v1/projects/{pid}/members/{member_id}"), 204)
        problem(await m.get(f"/v1/projects/{pid}"), 404, "not_found")


async def test_runtime_profiles(stack: Stack) -> None:
    world = await new_world(stack, "fay")
    base = f"/v1/projects/{world.project_id}/runtime-profiles"
    spec = {
        "backend": "docker",
        "image": "suzumio/runner:1",
        "limits": {"cpus": 0.5},
        "network": "egress",
    }
    async with stack.client(world.key) as c:
        # No network at all: only where the broker's socket can be bound in (docker, and the
        # process backend with bubblewrap).
        for backend in ("pool", "kubernetes"):
            offline = {**spec, "backend": backend, "pool": "default", "network": "none"}
            refused = problem(await c.put(f"{base}/small", json=offline), 422, "invalid")
            assert "network 'none' needs the docker backend" in refused["detail"]
        assert ok(await c.get(base)) == []
        for backend in ("docker", "process"):
            offline = {**spec, "backend": backend, "network": "none"}
            saved = ok(await c.put(f"{base}/offline", json=offline))
            assert saved["spec"]["network"] == "none"
        ok(await c.delete(f"{base}/offline"), 204)
        saved = ok(await c.put(f"{base}/small", json=spec))
        assert saved["spec"]["limits"]["cpus"] == 0.5
        assert saved["spec"]["limits"]["memory_mb"] == 1024  # defaults filled in
        assert [p["name"] for p in ok(await c.get(base))] == ["small"]
        problem(await c.put(f"{base}/nope", json={"backend": "docker"}), 422, "invalid")
        problem(await c.put(f"{base}/Bad_Name", json=spec), 422, "invalid")
        problem(await c.put(f"{base}/x", json={**spec, "limits": {"cpus": -1}}), 422, "invalid")
        ok(await c.delete(f"{base}/small"), 204)
        problem(await c.get(f"{base}/small"), 404, "not_found")
        problem(await c.delete(f"{base}/small"), 404, "not_found")


async def test_providers_keep_keys_write_only(stack: Stack) -> None:
    world = await new_world(stack, "gus")
    base = f"/v1/projects/{world.project_id}/providers"
    secret = "sk-test-" + "s3cr3t" * 6
    body = {"base_url": "https://llm.example.com/v1", "model": "m1", "api_key": secret}
    async with stack.client(world.key) as c:
        response = await c.put(f"{base}/main", json=body)
        saved = ok(response)
        assert saved["api_key_set"] is True
        assert secret not in response.text
        kept = ok(await c.put(f"{base}/main", json={**body, "api_key": None, "model": "m2"}))
        assert (kept["model"], kept["api_key_set"]) == ("m2", True)
        cleared = ok(
            await c.put(f"{base}/main", json={**body, "api_key": None, "clear_api_key": True})
        )
        assert cleared["api_key_set"] is False
        problem(await c.put(f"{base}/x", json={**body, "base_url": "ftp://x"}), 422, "invalid")
        ok(await c.delete(f"{base}/main"), 204)
        assert ok(await c.get(base)) == []


@pytest.mark.parametrize("role", ["viewer", "member"])
async def test_only_admins_change_project_settings(stack: Stack, role: str) -> None:
    owner = await new_world(stack, f"hal-{role}")
    key, user_id = await new_user(stack, f"ivy-{role}")
    pid = owner.project_id
    async with stack.client(owner.key) as c:
        ok(await c.put(f"/v1/projects/{pid}/members/{user_id}", json={"role": role}))
    async with stack.client(key) as c:
        problem(await c.patch(f"/v1/projects/{pid}", json={"name": "mine"}), 403, "forbidden")
        problem(
            await c.put(
                f"/v1/projects/{pid}/providers/p", json={"base_url": "https://x", "model": "m"}
            ),
            403,
            "forbidden",
        )


async def test_cluster_status_for_admins(stack: Stack) -> None:
    async with stack.client(stack.admin_key) as c:
        status = ok(await c.get("/v1/cluster/status"))
    services = {s["service"] for s in status["services"]}
    assert {"session", "gateway"} <= services
    assert all(s["seen_at"] >= s["started_at"] for s in status["services"])
    assert set(status["projections"]) >= {"projects", "sessions", "users", "artifacts"}
    assert all(p["lag"] >= 0 for p in status["projections"].values())
    events = next(v for k, v in status["streams"].items() if k.endswith("EVENTS"))
    assert events["messages"] > 0
    assert status["backends"] == []


async def test_an_agents_runtime_profile_can_be_set_back_to_none(stack: Stack) -> None:
    """Before, `"runtime_profile": null` was read as "leave it": an agent whose profile was
    deleted could never be given the default backend again."""
    world = await new_world(stack, "hal")
    spec = {"backend": "docker", "image": "suzumio/runner:1"}
    agent = f"/v1/agents/{world.agent_id}"
    async with stack.client(world.key) as c:
        ok(await c.put(f"/v1/projects/{world.project_id}/runtime-profiles/small", json=spec))
        assert ok(await c.patch(agent, json={"runtime_profile": "small"}))["runtime_profile"]
        kept = ok(await c.patch(agent, json={"prompt": "still small"}))
        assert (kept["runtime_profile"], kept["prompt"]) == ("small", "still small")
        cleared = ok(await c.patch(agent, json={"runtime_profile": None}))
        assert cleared["runtime_profile"] is None
        assert ok(await c.get(agent))["runtime_profile"] is None
        assert ok(await c.patch(agent, json={"runtime_profile": None}))["runtime_profile"] is None


async def test_a_profile_or_provider_an_agent_names_is_not_removed(stack: Stack) -> None:
    """Its activations would fail, unplanned: 409 naming the agents, and nothing removed.
    Once no agent names it (changed, or another project's), it goes."""
    world = await new_world(stack, "ida")
    other = await new_world(stack, "ida-other")
    profiles = f"/v1/projects/{world.project_id}/runtime-profiles"
    providers = f"/v1/projects/{world.project_id}/providers"
    agent = f"/v1/agents/{world.agent_id}"
    async with stack.client(world.key) as c:
        ok(await c.put(f"{profiles}/small", json={"backend": "process"}))
        for name in ("main", "spare"):
            ok(await c.put(f"{providers}/{name}", json={"base_url": "https://x", "model": "m"}))
        changed = {
            "runtime_profile": "small",
            "model": {"name": "m", "provider": "main"},
            "fallbacks": [{"name": "m2", "provider": "spare"}],
        }
        ok(await c.patch(agent, json=changed))

        for path in (f"{profiles}/small", f"{providers}/main", f"{providers}/spare"):
            refused = problem(await c.delete(path), 409, "conflict")
            assert "is used by agent 'helper': change them first" in refused["detail"], refused
        assert [p["name"] for p in ok(await c.get(profiles))] == ["small"]
        assert [p["name"] for p in ok(await c.get(providers))] == ["main", "spare"]

        ok(await c.patch(agent, json={"runtime_profile": None, "fallbacks": []}))
        ok(await c.delete(f"{profiles}/small"), 204)
        ok(await c.delete(f"{providers}/spare"), 204)
        problem(await c.delete(f"{providers}/main"), 409, "conflict")
    # Another project's agent naming a provider of the same name does not hold this one.
    async with stack.client(other.key) as c:
        path = f"/v1/projects/{other.project_id}/providers/main"
        ok(await c.put(path, json={"base_url": "https://x", "model": "m"}))
        ok(await c.delete(path), 204)
