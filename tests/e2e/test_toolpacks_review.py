"""Toolpack support operations through the real tool-broker: arguments the operation accepts but
the command it sends cannot carry are a 422 that records nothing, never a 500."""

from __future__ import annotations

import json

import httpx

from suzumio.contracts.events import SignalRecorded
from suzumio.contracts.values import MAX_PAYLOAD_BYTES
from tests.e2e.api import World, new_world, problem
from tests.e2e.runner_env import request_activation, token_of
from tests.e2e.stack import Stack


def broker(stack: Stack, world: World, activation_id: str) -> httpx.AsyncClient:
    token = token_of(stack, world, activation_id)
    return httpx.AsyncClient(
        base_url=stack.url_of("toolbroker"),
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


async def signals(stack: Stack, world: World) -> list[SignalRecorded]:
    stream = await stack.store.load("session", world.session_id)
    return [e.data for e in stream.events if isinstance(e.data, SignalRecorded)]


async def test_a_payload_the_broker_labels_past_the_limit_is_422(platform: Stack) -> None:
    world = await new_world(platform, "pala")
    activation_id = await request_activation(platform, world)
    # Exactly as large as a payload may be: `signal.record` takes it, and then adds its
    # labels (`kind`, `toolpack`), which the command to the session service cannot carry.
    filler = "x" * (MAX_PAYLOAD_BYTES - len(json.dumps({"blob": ""}, separators=(",", ":"))))
    payload = {"blob": filler}
    body = {
        "operation": "signal.record",
        "arguments": {"kind": "big", "payload": payload},
        "request_id": "big-1",
    }
    before = await signals(platform, world)
    async with broker(platform, world, activation_id) as c:
        problem(await c.post("/toolpacks/core/support", json=body), 422, "invalid")
    assert await signals(platform, world) == before
