"""A tool-broker app over real NATS, the real registry and gate, for tests of its routes: a
session with one requested activation and its token, and the session service as a recorder
of the commands it would get."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any, cast

import httpx
from nats.aio.client import Client as NATS

from suzumio.contracts.commands import Command, CommandAccepted
from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.events import ActivationRequested, SessionOpened
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.tokens import TokenSigner
from suzumio.toolbroker.access import Gate
from suzumio.toolbroker.bootstrap import create_app
from suzumio.toolbroker.pending import PendingWaiter
from suzumio.toolbroker.registry import ActivationRegistry
from suzumio.toolbroker.signed_first import SignedFirst
from suzumio.toolbroker.state import Broker, Metrics
from suzumio.toolbroker.support import SupportOperations

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


async def world(store: EventStore, toolpacks: tuple[str, ...] = ()) -> World:
    project_id, agent_id = new_id(), new_id()
    session_id = await opened(store, project_id, agent_id)
    activation_id = new_id()
    requested = ActivationRequested(
        activation_id=activation_id, agent_id=agent_id, signal_ids=(), project_id=project_id
    )
    await store.append_next(session_id, [requested], SCHEDULER)
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


def client(
    nc: NATS,
    topology: Topology,
    store: EventStore,
    registry: ActivationRegistry,
    commands: Recorder,
    token: str,
    operations: SupportOperations | None = None,
    live_budget: int | None = None,
    log_budget: int | None = None,
    waiter: PendingWaiter | None = None,
) -> httpx.AsyncClient:
    broker = Broker(
        nc=nc,
        js=nc.jetstream(),
        topology=topology,
        store=store,
        commands=cast("CommandClient", commands),
        registry=registry,
        operations=operations or SupportOperations({}),
        metrics=Metrics(),
        gate=Gate(TokenSigner([KEY]), registry, store),
        waiter=cast("Any", waiter),
        artifacts=cast("Any", None),
    )
    if live_budget is not None:
        broker.live_budget = live_budget
    if log_budget is not None:
        broker.log_budget = log_budget
    app = SignedFirst(create_app(broker), TokenSigner([KEY]))  # as the service serves it
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
        base_url="http://broker",
        headers={"Authorization": f"Bearer {token}"},
    )
