"""Toolpack support operations in the tool-broker's app (real NATS, the real registry and gate;
the session service is a recorder of the commands it would get):

- an operation that works a while before its effect (a toolpack's own requests) has no effect
  once its activation was cancelled meanwhile: 403 `fenced`, nothing sent;
- a session id a toolpack's code passes on unchecked (`*`, `>`) names no subject: 404, and no
  read of every session's events.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from nats.aio.client import Client as NATS

from suzumio.contracts.errors import NotFoundError
from suzumio.contracts.events import ActivationCancelRequested
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.tokens import ActivationClaims
from suzumio.toolbroker.registry import ActivationRegistry
from suzumio.toolbroker.support import SupportContext, SupportOperations
from tests.integration.broker_world import (
    SCHEDULER,
    Recorder,
    client,
    opened,
    world,
)


async def test_an_operation_cancelled_while_it_works_has_no_effect(
    nc: NATS, topology: Topology, store: EventStore, registry: ActivationRegistry
) -> None:
    w = await world(store, toolpacks=("slow",))
    recorder = Recorder()

    async def slow(ctx: SupportContext, arguments: dict[str, Any]) -> dict[str, Any]:
        # The toolpack asks a service of its own; meanwhile the activation is cancelled.
        await store.append_next(
            w.session_id,
            [ActivationCancelRequested(activation_id=w.activation_id, reason="P0")],
            SCHEDULER,
        )
        await asyncio.sleep(0.05)
        reply = await ctx.record_signal("late", {}, "P3", None)
        return reply.result

    operations = SupportOperations({})
    operations._ops["slow"] = {"slow.work": slow}  # an installed toolpack's operation
    async with client(nc, topology, store, registry, recorder, w.token, operations) as c:
        response = await c.post(
            "/toolpacks/slow/support",
            json={"operation": "slow.work", "arguments": {}, "request_id": "r1"},
        )
    assert response.status_code == 403, response.text
    assert response.json()["code"] == "fenced"
    assert recorder.sent == []


@pytest.mark.parametrize("target", ["*", ">"])
async def test_a_wildcard_session_id_names_no_session(store: EventStore, target: str) -> None:
    w = await world(store)
    # Other sessions of the same project: a wildcard read would find them (and mix up their
    # versions).
    for _ in range(2):
        await opened(store, w.project_id, w.agent_id)
    recorder = Recorder()
    claims = ActivationClaims(
        activation_id=w.activation_id,
        session_id=w.session_id,
        project_id=w.project_id,
        agent_id=w.agent_id,
        expires_at=datetime(2999, 1, 1, tzinfo=UTC),
    )
    ctx = SupportContext(claims, "some", "some.op", "r1", cast("CommandClient", recorder), store)
    with pytest.raises(NotFoundError):
        await ctx.post_message(target, "hello", None)
    assert recorder.sent == []
