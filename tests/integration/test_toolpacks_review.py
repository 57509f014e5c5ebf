"""Toolpack support operations in the tool-broker's app (real NATS, the real registry and gate;
the session service is a recorder of the commands it would get):

- an operation that works a while before its effect (a toolpack's own requests) has no effect
  once its activation was cancelled meanwhile: 403 `fenced`, nothing sent;
- a session id a toolpack's code passes on unchecked (`*`, `>`) names no subject: 404, and no
  read of every session's events.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from suzumio.contracts.commands import Command, CommandAccepted
from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.errors import NotFoundError
from suzumio.contracts.events import ActivationCancelRequested, ActivationRequested, SessionOpened
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.tokens import ActivationClaims, TokenSigner
from suzumio.toolbroker.access import Gate
from suzumio.toolbroker.bootstrap import create_app
from suzumio.toolbroker.registry import ActivationRegistry
from suzumio.toolbroker.state import Broker, Metrics
from suzumio.toolbroker.support import SupportContext, SupportOperations

KEY = "k" * 32
SCHEDULER = EventMeta(actor="system:scheduler")


class Recorder:
    """The session service, as far as these tests need it: each command is noted."""

    def __init__(self) -> None:
        self.sent: list[Command] = []

    async def send(self, command: Command, *, actor: str, **_: object) -> CommandAccepted:
        self.sent.append(command)
        return CommandAccepted(result={})


class World(SimpleNamespace):
    project_id: str
    agent_id: str
    session_id: str
    activation_id: str
    token: str


async def opened(store: EventStore, project_id: str, agent_id: str) -> str:
    session_id = new_id()
    await store.append(session_id, [SessionOpened(project_id=project_id, agent_id=agent_id)], 0)
    return session_id


@pytest_asyncio.fixture
async def registry(nc: NATS, topology: Topology) -> AsyncIterator[ActivationRegistry]:
    started = ActivationRegistry(nc, topology, timedelta(hours=1))
    await started.start()
    yield started
    await started.close()


async def world(store: EventStore, toolpacks: tuple[str, ...] = ()) -> World:
    project_id, agent_id = new_id(), new_id()
    session_id = await opened(store, project_id, agent_id)
    activation_id = new_id()
    await store.append_next(
        session_id,
        [
            ActivationRequested(
                activation_id=activation_id,
                agent_id=agent_id,
                signal_ids=(),
                project_id=project_id,
            )
        ],
        SCHEDULER,
    )
    token = TokenSigner([KEY]).issue(
        activation_id=activation_id,
        session_id=session_id,
        project_id=project_id,
        agent_id=agent_id,
        toolpacks=toolpacks,
        ttl=timedelta(minutes=5),
    )
    return World(
        project_id=project_id,
        agent_id=agent_id,
        session_id=session_id,
        activation_id=activation_id,
        token=token,
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
    broker = Broker(
        nc=nc,
        js=nc.jetstream(),
        topology=topology,
        store=store,
        commands=cast("CommandClient", recorder),
        registry=registry,
        operations=operations,
        metrics=Metrics(),
        gate=Gate(TokenSigner([KEY]), registry, store),
        waiter=cast("Any", None),
        artifacts=cast("Any", None),
    )
    transport = httpx.ASGITransport(app=create_app(broker))
    async with httpx.AsyncClient(
        transport=transport,
        base_url="http://broker",
        headers={"Authorization": f"Bearer {w.token}"},
    ) as c:
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
