"""A provider's key replaced while an activation runs reaches it on the provider's 401: the
runner asks the tool-broker for the current key (`POST /runner/credentials`) and calls the same
model again with it, instead of falling back. Against the real session, scheduler, tool-broker
and gateway processes; the runner is a real process (the test launcher plays the orchestrator's
part, putting the launch's key in its environment); the provider is the scripted model server
(the one allowed fake), which refuses any key but the one it is told is current.

And the broker's side: who gets which key, and how often."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from suzumio.contracts.events import ActivationCompleted
from suzumio.contracts.ids import new_id
from suzumio.contracts.runner import RunnerActivationInput
from suzumio.contracts.values import ModelSpec
from suzumio.platform.tokens import TokenSigner
from suzumio.runner import exits
from suzumio.testing.model_server import Reply, ScriptedModelServer, error_body
from tests.e2e.api import World, new_world, ok, problem
from tests.e2e.runner_env import launcher, post, request_activation
from tests.e2e.stack import Stack

pytestmark = pytest.mark.timeout(180)
PRIMARY = ModelSpec(name="primary", provider="main")
BACKUP = ModelSpec(name="backup", provider="main")


@dataclass
class Keyed:
    """An agent of `world`'s project calling `primary`, then `backup`, through provider
    `main`; `world.agent_id` / `session_id` are this agent's and its session's."""

    world: World
    old_key: str


async def keyed_agent(stack: Stack, model: ScriptedModelServer, name: str) -> Keyed:
    base_world = await new_world(stack, name)
    old_key = f"sk-old-{new_id().lower()}"
    base = f"/v1/projects/{base_world.project_id}"
    async with stack.client(base_world.key) as c:
        await set_provider(c, base_world.project_id, model, old_key)
        agent = ok(
            await c.post(
                f"{base}/agents",
                json={
                    "name": "keyed",
                    "role": "keyed",
                    "model": PRIMARY.model_dump(exclude_none=True),
                    "fallbacks": [BACKUP.model_dump(exclude_none=True)],
                },
            ),
            201,
        )
        session = ok(
            await c.post(f"{base}/sessions", json={"agent_id": agent["id"], "title": "k"}), 201
        )
    world = replace(base_world, agent_id=agent["id"], session_id=session["id"])
    return Keyed(world, old_key)


async def set_provider(
    c: httpx.AsyncClient, project_id: str, model: ScriptedModelServer, key: str
) -> None:
    body = {"base_url": f"{model.url}/v1", "model": "primary", "api_key": key}
    ok(await c.put(f"/v1/projects/{project_id}/providers/main", json=body))


def mint(stack: Stack, world: World, activation_id: str, **claims: Any) -> str:
    return TokenSigner([stack.secret_key]).issue(
        activation_id=activation_id,
        session_id=claims.pop("session_id", world.session_id),
        project_id=claims.pop("project_id", world.project_id),
        agent_id=claims.pop("agent_id", world.agent_id),
        ttl=timedelta(minutes=5),
        keyless=claims.pop("keyless", False),
    )


def broker(stack: Stack, token: str | None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(base_url=stack.url_of("toolbroker"), headers=headers, timeout=30)


ENDPOINT: dict[str, str] = {}  # the scripted model server's, as the providers name it


async def ask(
    stack: Stack, token: str | None, spec: ModelSpec, base_url: str | None = None
) -> httpx.Response:
    async with broker(stack, token) as b:
        body = {"model": spec.name, **({"provider": spec.provider} if spec.provider else {})}
        body["base_url"] = base_url or ENDPOINT["url"]
        return await b.post("/runner/credentials", json=body)


async def test_a_key_replaced_mid_activation_is_used_without_falling_back(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    keyed = await keyed_agent(platform, model, "rotating")
    world, old_key = keyed.world, keyed.old_key
    new_key = f"sk-new-{new_id().lower()}"
    current = old_key
    replaced = asyncio.Event()

    async def provider(_: dict[str, Any]) -> Reply:
        # One request at a time here: the last recorded is the one being answered.
        sent = model.completion_requests[-1].headers["authorization"].removeprefix("Bearer ")
        if len(model.completion_requests) == 1:
            await asyncio.wait_for(replaced.wait(), 60)  # held while the key is replaced
        if sent != current:
            refused = error_body(
                "Incorrect API key", type_="invalid_request_error", code="invalid_api_key"
            )
            return Reply.error(401, refused)
        return Reply.text("answered with the current key")

    model.default = provider

    def chain(spec: RunnerActivationInput) -> RunnerActivationInput:
        agent = spec.agent.model_copy(update={"model": PRIMARY, "fallbacks": (BACKUP,)})
        return spec.model_copy(update={"agent": agent})

    env = {  # what the orchestrator's plan puts in the sandbox: the launch's key
        "SUZUMIO_PROVIDER_MAIN_BASE_URL": f"{model.url}/v1",
        "SUZUMIO_PROVIDER_MAIN_API_KEY": old_key,
    }
    async with launcher(platform, model, tmp_path, world, customise=chain, env=env) as runs:
        await post(platform, world, "answer me")
        await model.wait_for_requests(1, timeout=60)
        async with platform.client(world.key) as c:
            await set_provider(c, world.project_id, model, new_key)
        current = new_key
        replaced.set()
        (run,) = await runs.wait_ended(1, timeout=90)

    assert run.exit_code == exits.COMPLETED, run.stderr[-3_000:]
    sent = [
        (r.model, r.headers["authorization"].removeprefix("Bearer "))
        for r in model.completion_requests
    ]
    assert sent == [("primary", old_key), ("primary", new_key)]  # no fallback
    stream = await platform.store.load("activation", run.activation_id)
    completed = next(e.data for e in stream.events if isinstance(e.data, ActivationCompleted))
    assert completed.text == "answered with the current key"
    assert completed.usage["model"] == "primary"
    assert completed.usage["model_calls"] == 1
    # The refused call, past which the loop got, is in the event the orchestrator counts from.
    assert completed.usage["model_failures"] == {"auth": 1}
    # Neither key in the runner's log nor in any service's.
    logs = run.stderr + "".join(p.read_text(errors="replace") for p in platform.logs)
    assert "credential_refreshed" in run.stderr
    assert new_key not in logs
    assert old_key not in logs


async def test_the_broker_answers_only_its_own_agents_providers(
    platform: Stack, model: ScriptedModelServer
) -> None:
    ENDPOINT["url"] = f"{model.url}/v1"
    mine = await keyed_agent(platform, model, "owner")
    theirs = await keyed_agent(platform, model, "stranger")
    their_key = f"sk-theirs-{new_id().lower()}"
    async with platform.client(theirs.world.key) as c:
        await set_provider(c, theirs.world.project_id, model, their_key)
        body = {"base_url": f"{model.url}/v1", "model": "x", "api_key": their_key}
        ok(await c.put(f"/v1/projects/{theirs.world.project_id}/providers/other", json=body))
    activation_id = await request_activation(platform, mine.world)
    token = mint(platform, mine.world, activation_id)

    # Its own provider: the key its project holds (not the other project's of the same name).
    answered = await ask(platform, token, PRIMARY)
    assert answered.status_code == 200, answered.text
    assert answered.json() == {"provider": "main", "api_key": mine.old_key}
    assert answered.headers["cache-control"] == "no-store"

    # Not again at once: a runner looping on 401s gets 429 with Retry-After.
    limited = problem(await ask(platform, token, BACKUP), 429, "rate_limited")
    assert limited["detail"]
    assert int((await ask(platform, token, BACKUP)).headers["retry-after"]) >= 1

    # Another project's provider, by a name only that project has: 404 as if missing.
    fresh = mint(platform, mine.world, await request_activation(platform, mine.world))
    problem(await ask(platform, fresh, ModelSpec(name="x", provider="other")), 404, "not_found")
    # A model the agent does not call through that provider, and the platform's endpoint.
    problem(await ask(platform, fresh, ModelSpec(name="gpt", provider="main")), 404, "not_found")
    default = problem(await ask(platform, fresh, ModelSpec(name="primary")), 404, "not_found")
    assert "default endpoint" in default["detail"]

    # A token of another activation's agent (the project's first agent calls no provider).
    other_agent = await new_agent_world(platform, mine.world)
    others = mint(platform, other_agent, await request_activation(platform, other_agent))
    problem(await ask(platform, others, PRIMARY), 404, "not_found")
    # That activation's token claiming the keyed agent does not match its activation.
    mixed = mint(
        platform, other_agent, await request_activation(platform, other_agent),
        agent_id=mine.world.agent_id,
    )  # fmt: skip
    problem(await ask(platform, mixed, PRIMARY), 403, "forbidden")

    # An activation without network (its token says so): the relay calls its models, and no
    # key may enter its sandbox, not even through here.
    keyless = mint(
        platform, mine.world, await request_activation(platform, mine.world), keyless=True
    )
    refused = problem(await ask(platform, keyless, PRIMARY), 404, "not_found")
    assert "relay" in refused["detail"]

    # No token at all, or a forged one.
    problem(await ask(platform, None, PRIMARY), 401, "unauthenticated")
    problem(await ask(platform, token + "x", PRIMARY), 401, "unauthenticated")

    # The provider moved to another endpoint with a new key: the new key is for the new
    # endpoint, and never goes to a runner still calling the old one (maybe the one refusing).
    moved_key = f"sk-moved-{new_id().lower()}"
    async with platform.client(mine.world.key) as c:
        body = {
            "base_url": "https://elsewhere.example/v1",
            "model": "primary",
            "api_key": moved_key,
        }
        ok(await c.put(f"/v1/projects/{mine.world.project_id}/providers/main", json=body))
    moved = mint(platform, mine.world, await request_activation(platform, mine.world))
    problem(await ask(platform, moved, PRIMARY), 404, "not_found")
    again = mint(platform, mine.world, await request_activation(platform, mine.world))
    answered = await ask(platform, again, PRIMARY, "https://elsewhere.example/v1")
    assert answered.json() == {"provider": "main", "api_key": moved_key}

    logs = "".join(p.read_text(errors="replace") for p in platform.logs)
    assert mine.old_key not in logs
    assert their_key not in logs
    assert moved_key not in logs


async def new_agent_world(stack: Stack, world: World) -> World:
    """Another agent of `world`'s project (no provider), with a session of its own."""
    base = f"/v1/projects/{world.project_id}"
    async with stack.client(world.key) as c:
        agent = ok(
            await c.post(
                f"{base}/agents",
                json={"name": "plain", "role": "plain", "model": {"name": "demo"}},
            ),
            201,
        )
        session = ok(
            await c.post(f"{base}/sessions", json={"agent_id": agent["id"], "title": "p"}), 201
        )
    return replace(world, agent_id=agent["id"], session_id=session["id"])
