"""Every agent and project as the orchestrator's follower folds them from the log: what a
plan needs of them (the agent's settings; the project's runtime profiles, providers and mount
grants), exactly as they were when its request was stored — no read per plan."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from suzumio.contracts.envelope import DomainEvent
from suzumio.contracts.events import (
    AgentCreated,
    AgentUpdated,
    MountGranted,
    MountRevoked,
    ProjectCreated,
    ProjectRenamed,
    ProviderRemoved,
    ProviderSet,
    RuntimeProfileRemoved,
    RuntimeProfileSet,
)
from suzumio.contracts.values import (
    AssetRef,
    ModelSpec,
    MountMode,
    ProviderSpec,
    RuntimeProfileSpec,
    ToolPolicy,
    WorkspaceMode,
)


@dataclass
class Agent:
    id: str
    project_id: str = ""
    role: str = ""
    prompt: str = ""
    model: ModelSpec = field(default_factory=lambda: ModelSpec(name="unset"))
    fallbacks: tuple[ModelSpec, ...] = ()
    tools: tuple[str, ...] = ()
    toolpacks: tuple[str, ...] = ()
    runtime_profile: str | None = None
    permissions: dict[str, ToolPolicy] = field(default_factory=dict)
    workspace_mode: WorkspaceMode = WorkspaceMode.COPY
    assets: tuple[AssetRef, ...] = ()


@dataclass(frozen=True)
class Grant:
    host_path: str
    target: str
    writable: bool
    agent_id: str | None


@dataclass
class Project:
    id: str
    name: str = ""
    profiles: dict[str, RuntimeProfileSpec] = field(default_factory=dict)
    providers: dict[str, ProviderSpec] = field(default_factory=dict)
    grants: dict[str, Grant] = field(default_factory=dict)


AGENT_EVENTS = frozenset({AgentCreated.event_type, AgentUpdated.event_type})
PROJECT_EVENTS = frozenset(
    t.event_type
    for t in (
        ProjectCreated, ProjectRenamed, RuntimeProfileSet, RuntimeProfileRemoved,
        ProviderSet, ProviderRemoved, MountGranted, MountRevoked,
    )
)  # fmt: skip
AGENT_FIELDS = (
    "role", "prompt", "model", "fallbacks", "tools", "toolpacks",
    "runtime_profile", "permissions", "workspace_mode", "assets",
)  # fmt: skip


class Directory:
    """Every agent and project, folded from the log the orchestrator follows anyway: a plan
    then needs no read of them, and sees them exactly as they were when its request was
    folded (everything stored before it, nothing after).

    States are replaced, never changed in place, so a state handed out stays as it was."""

    EVENT_TYPES = AGENT_EVENTS | PROJECT_EVENTS

    def __init__(self) -> None:
        self._agents: dict[str, Agent] = {}
        self._projects: dict[str, Project] = {}

    def agent(self, agent_id: str) -> Agent | None:
        return self._agents.get(agent_id)

    def project(self, project_id: str) -> Project:
        return self._projects.get(project_id) or Project(project_id)

    def apply(self, aggregate_id: str, data: DomainEvent) -> None:
        match data:
            case AgentCreated() | AgentUpdated():
                self._agents[aggregate_id] = fold_agent(
                    self._agents.get(aggregate_id) or Agent(aggregate_id), data
                )
            case (
                ProjectCreated() | ProjectRenamed() | RuntimeProfileSet() | RuntimeProfileRemoved()
                | ProviderSet() | ProviderRemoved() | MountGranted() | MountRevoked()
            ):  # fmt: skip
                self._projects[aggregate_id] = fold_project(
                    self._projects.get(aggregate_id) or Project(aggregate_id), data
                )


def fold_agent(agent: Agent, data: AgentCreated | AgentUpdated) -> Agent:
    if isinstance(data, AgentCreated):
        return replace(
            agent,
            project_id=data.project_id,
            **{name: getattr(data, name) for name in AGENT_FIELDS},
        )
    changed = {n: v for n in AGENT_FIELDS if (v := getattr(data, n)) is not None}
    return replace(agent, **changed)


def fold_project(project: Project, data: DomainEvent) -> Project:
    profiles, providers = dict(project.profiles), dict(project.providers)
    grants, name = dict(project.grants), project.name
    match data:
        case ProjectCreated() | ProjectRenamed():
            name = data.name
        case RuntimeProfileSet():
            profiles[data.name] = data.spec
        case RuntimeProfileRemoved():
            profiles.pop(data.name, None)
        case ProviderSet():
            providers[data.name] = data.spec
        case ProviderRemoved():
            providers.pop(data.name, None)
        case MountGranted():
            writable = data.mode is MountMode.READ_WRITE
            grants[data.grant_id] = Grant(data.host_path, data.target, writable, data.agent_id)
        case MountRevoked():
            grants.pop(data.grant_id, None)
    return Project(project.id, name, profiles, providers, grants)
