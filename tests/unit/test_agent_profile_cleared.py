"""An update that sets an agent's runtime profile back to none is folded as such by the
services that keep agents in memory (the scheduler picks the backend by it, the orchestrator
plans by it), and by the session service's own state."""

from __future__ import annotations

import pytest

from suzumio.contracts.commands import UpdateAgent
from suzumio.contracts.events import AgentCreated, AgentUpdated
from suzumio.contracts.values import ModelSpec
from suzumio.orchestrator.directory import Agent, fold_agent
from suzumio.scheduler.domain.world import World
from suzumio.session.domain import agent as agent_domain
from suzumio.session.domain.agent import AgentState
from suzumio.session.domain.project import ProjectState
from tests.unit.test_scheduling_state import Log

CREATED = AgentCreated(
    project_id="p",
    name="a",
    role="r",
    prompt="",
    model=ModelSpec(name="m"),
    runtime_profile="s",
)
CLEARED = AgentUpdated(runtime_profile_cleared=True)


def test_the_orchestrators_fold_clears_it() -> None:
    agent = fold_agent(Agent(id="a1"), CREATED)
    assert agent.runtime_profile == "s"
    assert fold_agent(agent, AgentUpdated(prompt="p2")).runtime_profile == "s"
    assert fold_agent(agent, CLEARED).runtime_profile is None


def test_the_schedulers_fold_clears_it() -> None:
    world = World()
    log = Log(world)
    log.append("a1", CREATED)
    assert world.agents["a1"].runtime_profile == "s"
    log.append("a1", AgentUpdated(prompt="p2"))
    assert world.agents["a1"].runtime_profile == "s"
    log.append("a1", CLEARED)
    assert world.agents["a1"].runtime_profile is None


def test_the_session_service_clears_it_once_and_refuses_both_at_once() -> None:
    state = AgentState("a1")
    state.fold(CREATED, 1, 1)
    project = ProjectState("p")
    clear = UpdateAgent(agent_id="a1", clear_runtime_profile=True)
    (event,) = agent_domain.update(state, project, clear)
    assert isinstance(event, AgentUpdated)
    assert event.runtime_profile_cleared
    state.fold(event, 2, 2)
    assert state.config["runtime_profile"] is None
    assert agent_domain.update(state, project, clear) == []  # nothing left to clear
    with pytest.raises(ValueError, match="not both"):
        UpdateAgent(agent_id="a1", runtime_profile="s", clear_runtime_profile=True)


def _profile_and_toolpacks(world: World) -> tuple[str | None, tuple[str, ...]]:
    agent = world.agents["a1"]
    return agent.runtime_profile, agent.toolpacks


def test_the_schedulers_fold_keeps_the_toolpacks_with_the_profile() -> None:
    """The toolpacks decide which toolpack hooks see the agent; an update may change them and
    the profile at once (one case of the fold must not take the whole update)."""
    world = World()
    log = Log(world)
    log.append("a1", CREATED.model_copy(update={"toolpacks": ("todo",)}))
    assert _profile_and_toolpacks(world) == ("s", ("todo",))
    log.append("a1", AgentUpdated(runtime_profile="big", toolpacks=("todo", "web")))
    assert _profile_and_toolpacks(world) == ("big", ("todo", "web"))
    log.append("a1", AgentUpdated(runtime_profile_cleared=True, toolpacks=()))
    assert _profile_and_toolpacks(world) == (None, ())
    log.append("a1", AgentUpdated(prompt="p3"))
    assert _profile_and_toolpacks(world) == (None, ())
