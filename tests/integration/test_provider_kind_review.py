"""`ProviderSpec.kind` says `anthropic` is a kind, but the runner speaks the OpenAI API only
(docs/runner.md): such a provider was stored, then called as if it were OpenAI-compatible.
The session service refuses it (a typed `invalid`, nothing stored), and the planner refuses
one stored before that with a plan error (which fails the activation, not retryable)."""

from __future__ import annotations

from typing import Any

import pytest
from nats.aio.client import Client as NATS

from suzumio.contracts.commands import SetProvider
from suzumio.contracts.errors import InvalidError
from suzumio.contracts.events import ProjectCreated, ProviderSet
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.contracts.values import ModelSpec, ProviderSpec
from suzumio.orchestrator.directory import Agent, Project
from suzumio.orchestrator.planning import PlanError, Planner
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.platform.bus.commands import CommandClient, CommandServer
from suzumio.platform.bus.eventstore import EventStore
from suzumio.session.handlers import build_router as session_router
from suzumio.session.handlers.base import Context
from suzumio.session.repository import Repository

ANTHROPIC = ProviderSpec(kind="anthropic", base_url="https://api.anthropic.com", model="claude")


async def test_the_session_service_refuses_an_anthropic_provider(
    nc: NATS, topology: Topology, store: EventStore, commands: CommandClient
) -> None:
    project_id = new_id()
    await store.append(project_id, [ProjectCreated(name="p", owner_id="u")], 0)
    server = CommandServer(nc, topology, session_router(Context(Repository(store))))
    await server.start()
    try:
        with pytest.raises(InvalidError, match="'anthropic' is not supported yet"):
            await commands.send(
                SetProvider(project_id=project_id, name="claude", spec=ANTHROPIC),
                actor="system:test",
            )
        stream = await store.load("project", project_id)
        assert not [e for e in stream.events if isinstance(e.data, ProviderSet)]
        openai = ANTHROPIC.model_copy(update={"kind": "openai"})
        await commands.send(
            SetProvider(project_id=project_id, name="claude", spec=openai), actor="system:test"
        )
        stream = await store.load("project", project_id)
        assert [e.data.spec for e in stream.events if isinstance(e.data, ProviderSet)] == [openai]
    finally:
        await server.drain(2)


def test_the_planner_refuses_a_stored_anthropic_provider() -> None:
    nothing: Any = None
    planner = Planner(store=nothing, signer=nothing, box=None, settings=OrchestratorSettings())
    project = Project(id="p1", providers={"claude": ANTHROPIC})
    agent = Agent(id="a1", model=ModelSpec(name="claude", provider="claude"))
    with pytest.raises(PlanError, match="'anthropic', which is not supported yet"):
        planner._model_env(agent, project)
