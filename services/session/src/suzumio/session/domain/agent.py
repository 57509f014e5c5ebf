"""The agent aggregate: a configured role in a project."""

from __future__ import annotations

from typing import Any, ClassVar

from suzumio.contracts.commands import CreateAgent, DisableAgent, EnableAgent, UpdateAgent
from suzumio.contracts.envelope import DomainEvent
from suzumio.contracts.errors import InvalidError, id_taken
from suzumio.contracts.events import AgentCreated, AgentDisabled, AgentEnabled, AgentUpdated
from suzumio.contracts.values import MAX_ENV_FACTS
from suzumio.session.domain.project import ProjectState
from suzumio.session.domain.state import AggregateState

# Flags of an update, not fields of the agent.
CLEARED = {"runtime_profile_cleared"}


class AgentState(AggregateState):
    aggregate: ClassVar[str] = "agent"

    def __init__(self, aggregate_id: str) -> None:
        super().__init__(aggregate_id)
        self.project_id = ""
        self.disabled = False
        self.config: dict[str, Any] = {}

    def apply(self, data: DomainEvent) -> None:
        match data:
            case AgentCreated():
                self.project_id = data.project_id
                self.config = data.model_dump(exclude={"project_id"})
            case AgentUpdated():
                self.config.update(data.model_dump(exclude_none=True, exclude=CLEARED))
                if data.runtime_profile_cleared:
                    self.config["runtime_profile"] = None
            case AgentDisabled():
                self.disabled = True
            case AgentEnabled():
                self.disabled = False


def _check_references(
    project: ProjectState,
    runtime_profile: str | None,
    providers: list[str | None],
    env_facts: dict[str, str] | None,
) -> None:
    if runtime_profile and runtime_profile not in project.profiles:
        raise InvalidError(f"the project has no runtime profile {runtime_profile!r}")
    for provider in providers:
        if provider and provider not in project.providers:
            raise InvalidError(f"the project has no provider {provider!r}")
    if env_facts and len(env_facts) > MAX_ENV_FACTS:
        raise InvalidError(f"at most {MAX_ENV_FACTS} env facts")


def create(state: AgentState, project: ProjectState, cmd: CreateAgent) -> list[DomainEvent]:
    if state.exists:
        raise id_taken("an agent")
    providers = [cmd.model.provider, *(m.provider for m in cmd.fallbacks)]
    _check_references(project, cmd.runtime_profile, providers, cmd.env_facts)
    return [AgentCreated(**cmd.model_dump(exclude={"agent_id"}))]


def update(state: AgentState, project: ProjectState, cmd: UpdateAgent) -> list[DomainEvent]:
    changes = cmd.model_dump(exclude={"agent_id", "clear_runtime_profile"}, exclude_none=True)
    current = {k: state.config.get(k) for k in changes}
    clear = cmd.clear_runtime_profile and state.config.get("runtime_profile") is not None
    if changes == current and not clear:
        return []
    model = cmd.model.provider if cmd.model else None
    providers = [model, *(m.provider for m in cmd.fallbacks or ())]
    _check_references(project, cmd.runtime_profile, providers, cmd.env_facts)
    return [AgentUpdated(**changes, runtime_profile_cleared=clear)]


def disable(state: AgentState, cmd: DisableAgent) -> list[DomainEvent]:
    return [] if state.disabled else [AgentDisabled(reason=cmd.reason)]


def enable(state: AgentState, _: EnableAgent) -> list[DomainEvent]:
    return [AgentEnabled()] if state.disabled else []
