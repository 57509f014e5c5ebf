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
    SessionOpened,
)
from suzumio.contracts.runner import FileRef, placeable
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
from suzumio.platform.logging import get_logger

log = get_logger(__name__)


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
    env_facts: dict[str, str] = field(default_factory=dict)
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
    t.event_type for t in (ArtifactRecorded, ArtifactDeleted, SessionOpened, SessionClosed)
)
AGENT_FIELDS = (
    "role", "prompt", "model", "fallbacks", "tools", "toolpacks",
    "runtime_profile", "permissions", "workspace_mode", "env_facts", "assets",
)  # fmt: skip


class Directory:
    """Every agent and project, folded from the log the orchestrator follows anyway: a plan
    then needs no read of them, and sees them exactly as they were when its request was
    folded (everything stored before it, nothing after).

    States are replaced, never changed in place, so a state handed out stays as it was.

    A session's artifacts are folded too: a plan sees every one stored before it is made —
    the previous activation's outputs included, which the projection might not have caught up
    with yet — without a query. Only an open session's are held, and only the newest of each
    path, so what is held grows with the open sessions' distinct paths. Where the fold cannot
    answer as the projection would, it says so (`session_files` is None) and the projection
    answers: a session closed (even if reopened since: its files were let go), and a session
    whose newest file of a path was deleted when there had been one before it at that path
    (which shows again, and which the fold let go)."""

    EVENT_TYPES = AGENT_EVENTS | PROJECT_EVENTS | FILE_EVENTS

    def __init__(self) -> None:
        self._agents: dict[str, Agent] = {}
        self._projects: dict[str, Project] = {}
        self._open: set[str] = set()  # sessions whose files the fold holds
        self._files: dict[str, dict[str, Artifact]] = {}  # open session → path → newest there
        self._where: dict[str, tuple[str, str]] = {}  # a held artifact → its session and path
        self._older: set[tuple[str, str]] = set()  # (session, path) with an older one let go

    def _let_go(self, session_id: str) -> None:
        self._open.discard(session_id)
        for path, artifact in self._files.pop(session_id, {}).items():
            self._where.pop(artifact.id, None)
            self._older.discard((session_id, path))

    def agent(self, agent_id: str) -> Agent | None:
        return self._agents.get(agent_id)

    def project(self, project_id: str) -> Project:
        return self._projects.get(project_id) or Project(project_id)

    def session_files(self, session_id: str) -> dict[str, Artifact] | None:
        """The session's artifacts by path (the newest of each path), in path order; None
        when the fold does not hold them (then the projection knows)."""
        if session_id not in self._open:
            return None
        return dict(sorted(self._files.get(session_id, {}).items()))

    def apply(self, aggregate_id: str, data: DomainEvent) -> None:
        match data:
            case SessionOpened() | SessionClosed() | ArtifactRecorded() | ArtifactDeleted():
                self._fold_files(aggregate_id, data)
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

    def _fold_files(self, aggregate_id: str, data: DomainEvent) -> None:
        match data:
            case SessionOpened():
                self._open.add(aggregate_id)
            case SessionClosed():
                self._let_go(aggregate_id)
            case ArtifactRecorded():
                if data.session_id in self._open:
                    files = self._files.setdefault(data.session_id, {})
                    replaced = files.get(data.path)
                    if replaced is not None:
                        self._where.pop(replaced.id, None)
                        self._older.add((data.session_id, data.path))
                    files[data.path] = Artifact(aggregate_id, data.path, data.sha256, data.size)
                    self._where[aggregate_id] = (data.session_id, data.path)
            case ArtifactDeleted():
                held = self._where.pop(aggregate_id, None)
                if held is None:
                    return  # not held: an older one of its path, or not a session's
                session_id, path = held
                if held in self._older:  # the one before it shows again, and was let go
                    self._let_go(session_id)
                else:
                    del self._files[session_id][path]


def asset_files(agent: Agent) -> tuple[FileRef, ...]:
    """The agent package's assets as the runner fetches them; one at a path no workspace can
    hold (only a command sent by hand could have stored it: an import refuses such names) is
    left out rather than failing every activation of the agent."""
    files: list[FileRef] = []
    for asset in agent.assets:
        if placeable(asset.path):
            files.append(FileRef(path=asset.path, sha256=asset.sha256, size=asset.size))
        else:
            log.warning("assets.unplaceable", agent=agent.id, path=asset.path[:300])
    return tuple(files)


def fold_agent(agent: Agent, data: AgentCreated | AgentUpdated) -> Agent:
    if isinstance(data, AgentCreated):
        return replace(
            agent,
            project_id=data.project_id,
            **{name: getattr(data, name) for name in AGENT_FIELDS},
        )
    changed = {n: v for n in AGENT_FIELDS if (v := getattr(data, n)) is not None}
    if data.runtime_profile_cleared:
        changed["runtime_profile"] = None
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
