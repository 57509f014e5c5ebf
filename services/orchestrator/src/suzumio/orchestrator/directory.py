"""Every agent and project as the orchestrator's follower folds them from the log: what a
plan needs of them (the agent's settings; the project's runtime profiles, providers and mount
grants), exactly as they were when its request was stored — no read per plan; and each open
session's artifacts, the files its next activation starts with."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from suzumio.contracts.envelope import DomainEvent
from suzumio.contracts.events import (
    AgentCreated,
    AgentUpdated,
    ArtifactDeleted,
    ArtifactRecorded,
    MountGranted,
    MountRevoked,
    ProjectCreated,
    ProjectRenamed,
    ProviderRemoved,
    ProviderSet,
    RuntimeProfileRemoved,
    RuntimeProfileSet,
    SessionClosed,
    SessionReopened,
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
from suzumio.orchestrator.sessions import Artifact


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
FILE_EVENTS = frozenset(
    t.event_type for t in (ArtifactRecorded, ArtifactDeleted, SessionClosed, SessionReopened)
)
AGENT_FIELDS = (
    "role", "prompt", "model", "fallbacks", "tools", "toolpacks",
    "runtime_profile", "permissions", "workspace_mode", "assets",
)  # fmt: skip


class Directory:
    """Every agent and project, folded from the log the orchestrator follows anyway: a plan
    then needs no read of them, and sees them exactly as they were when its request was
    folded (everything stored before it, nothing after).

    States are replaced, never changed in place, so a state handed out stays as it was.

    A session's artifacts are folded too: a plan sees every one stored before its request —
    the previous activation's outputs included, which the projection might not have caught up
    with yet — without a query. A closed session's are let go (it runs nothing), so what is
    held grows with the open sessions' files only; a session reopened after that is answered
    from the projection instead (`session_files` is None for it)."""

    EVENT_TYPES = AGENT_EVENTS | PROJECT_EVENTS | FILE_EVENTS

    def __init__(self) -> None:
        self._agents: dict[str, Agent] = {}
        self._projects: dict[str, Project] = {}
        self._files: dict[str, dict[str, Artifact]] = {}  # session → id → artifact, log order
        self._session_of: dict[str, str] = {}  # artifact → its session
        self._let_go: set[str] = set()  # reopened sessions whose earlier files were let go

    def agent(self, agent_id: str) -> Agent | None:
        return self._agents.get(agent_id)

    def project(self, project_id: str) -> Project:
        return self._projects.get(project_id) or Project(project_id)

    def session_files(self, session_id: str) -> dict[str, Artifact] | None:
        """The session's artifacts by path (the newest of each path), in path order; None if
        the fold let them go (a closed session, reopened since)."""
        if session_id in self._let_go:
            return None
        newest = {a.path: a for a in self._files.get(session_id, {}).values()}
        return dict(sorted(newest.items()))

    def apply(self, aggregate_id: str, data: DomainEvent) -> None:
        match data:
            case ArtifactRecorded():
                if data.session_id is not None:
                    artifact = Artifact(aggregate_id, data.path, data.sha256, data.size)
                    self._files.setdefault(data.session_id, {})[aggregate_id] = artifact
                    self._session_of[aggregate_id] = data.session_id
            case ArtifactDeleted():
                session_id = self._session_of.pop(aggregate_id, None)
                files = self._files.get(session_id or "")
                if files is not None:
                    files.pop(aggregate_id, None)
            case SessionClosed():
                for artifact_id in self._files.pop(aggregate_id, {}):
                    self._session_of.pop(artifact_id, None)
            case SessionReopened():
                self._let_go.add(aggregate_id)
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
