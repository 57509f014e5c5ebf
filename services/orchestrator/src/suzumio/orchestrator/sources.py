"""What a launch plan is made of, read from the log: the agent's settings, the project's
runtime profiles, providers and mount grants, and the session's active history, the batch's
signals and the latest checkpoint. Read per aggregate (not from projections), so a launch
sees every fact stored before its request, whatever the projector's lag."""

from __future__ import annotations

from dataclasses import dataclass, field

from suzumio.contracts.events import (
    ActivationRequested,
    AgentCreated,
    AgentUpdated,
    CheckpointSaved,
    HistoryCompacted,
    MountGranted,
    MountRevoked,
    ProjectCreated,
    ProjectRenamed,
    ProviderRemoved,
    ProviderSet,
    RuntimeProfileRemoved,
    RuntimeProfileSet,
    SessionMessageAppended,
    SessionOpened,
    SignalRecorded,
)
from suzumio.contracts.runner import AgentHistoryMessage, CheckpointRef, SignalSpec, ToolCall
from suzumio.contracts.values import (
    AssetRef,
    ModelSpec,
    MountMode,
    ProviderSpec,
    RuntimeProfileSpec,
    ToolPolicy,
    WorkspaceMode,
)
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.db.pool import Pool

SUMMARY_PREFIX = "[Summary of earlier conversation]"


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


@dataclass(frozen=True)
class Artifact:
    path: str
    sha256: str
    size: int


@dataclass
class SessionSnapshot:
    project_id: str
    history: tuple[AgentHistoryMessage, ...]
    signals: tuple[SignalSpec, ...]
    checkpoint: CheckpointRef | None
    artifacts: dict[str, Artifact]


async def load_agent(store: EventStore, agent_id: str) -> Agent:
    agent = Agent(agent_id)
    for event in (await store.load("agent", agent_id)).events:
        match event.data:
            case AgentCreated() as d:
                agent.project_id, agent.role, agent.prompt = d.project_id, d.role, d.prompt
                agent.model, agent.fallbacks = d.model, d.fallbacks
                agent.tools, agent.toolpacks = d.tools, d.toolpacks
                agent.runtime_profile, agent.permissions = d.runtime_profile, d.permissions
                agent.workspace_mode, agent.assets = d.workspace_mode, d.assets
            case AgentUpdated() as d:
                for name in (
                    "role", "prompt", "model", "fallbacks", "tools", "toolpacks",
                    "runtime_profile", "permissions", "workspace_mode", "assets",
                ):  # fmt: skip
                    value = getattr(d, name)
                    if value is not None:
                        setattr(agent, name, value)
    return agent


async def load_project(store: EventStore, project_id: str) -> Project:
    project = Project(project_id)
    for event in (await store.load("project", project_id)).events:
        match event.data:
            case ProjectCreated() | ProjectRenamed() as d:
                project.name = d.name
            case RuntimeProfileSet() as d:
                project.profiles[d.name] = d.spec
            case RuntimeProfileRemoved() as d:
                project.profiles.pop(d.name, None)
            case ProviderSet() as d:
                project.providers[d.name] = d.spec
            case ProviderRemoved() as d:
                project.providers.pop(d.name, None)
            case MountGranted() as d:
                writable = d.mode is MountMode.READ_WRITE
                project.grants[d.grant_id] = Grant(d.host_path, d.target, writable, d.agent_id)
            case MountRevoked() as d:
                project.grants.pop(d.grant_id, None)
    return project


async def load_session(
    store: EventStore, session_id: str, request: ActivationRequested
) -> SessionSnapshot:
    """The session as it was when the activation was requested: the active history (after
    the last compaction, whose summary stands in for the archived range), the batch's signals
    in the scheduler's order, the latest checkpoint and the session's artifacts."""
    history: list[AgentHistoryMessage] = []
    texts: dict[str, str] = {}
    signals: dict[str, SignalSpec] = {}
    checkpoint: CheckpointRef | None = None
    project_id = ""
    for event in (await store.load("session", session_id)).events:
        data = event.data
        match data:
            case SessionOpened():
                project_id = data.project_id
            case SessionMessageAppended():
                texts[data.message_id] = data.text
                history.append(_entry(data))
            case HistoryCompacted():
                history = compacted(history, data)
            case SignalRecorded():
                signals[data.signal_id] = SignalSpec(
                    id=data.signal_id,
                    kind=data.kind,
                    priority=data.priority,
                    payload=data.payload,
                    text=texts.get(data.message_id or ""),
                    message_id=data.message_id,
                )
            case CheckpointSaved():
                checkpoint = CheckpointRef(
                    id=data.checkpoint_id, created_at=event.envelope.occurred_at, data=data.data
                )
            case ActivationRequested() if data.activation_id == request.activation_id:
                break
    return SessionSnapshot(
        project_id=project_id,
        history=tuple(history),
        signals=tuple(signals[i] for i in request.signal_ids if i in signals),
        checkpoint=checkpoint,
        artifacts={},
    )


def _entry(data: SessionMessageAppended) -> AgentHistoryMessage:
    role = data.role if data.role in {"system", "user", "assistant", "tool"} else "user"
    return AgentHistoryMessage(
        id=data.message_id,
        role=role,  # type: ignore[arg-type]
        content=data.text,
        tool_calls=tuple(
            ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in data.tool_calls
        ),
        tool_call_id=data.tool_call_id,
        name=data.name,
    )


async def session_artifacts(pool: Pool, session_id: str) -> dict[str, Artifact]:
    """The session's artifacts by path, newest per path (from the projection: artifacts are
    aggregates of their own, listed by session only there)."""
    rows = await pool.fetch(
        "SELECT DISTINCT ON (path) path, sha256, size FROM proj_artifacts.artifacts"
        " WHERE session_id = $1 AND deleted_at IS NULL ORDER BY path, position DESC",
        session_id,
    )
    return {r["path"]: Artifact(r["path"], r["sha256"], r["size"]) for r in rows}


def compacted(
    history: list[AgentHistoryMessage], marker: HistoryCompacted
) -> list[AgentHistoryMessage]:
    """The history with the archived entries replaced by the summary, where they stood."""
    gone = set(marker.archived_ids)
    if not gone:  # an older marker: everything up to the range's end
        ids = [h.id for h in history]
        if marker.archived_through not in ids:
            return history
        gone = {i for i in ids[: ids.index(marker.archived_through) + 1] if i}
    place = next((i for i, h in enumerate(history) if h.id in gone), None)
    if place is None:
        return history
    kept = [h for h in history if h.id not in gone]
    summary = AgentHistoryMessage(
        id=marker.marker_id, role="user", content=f"{SUMMARY_PREFIX}\n{marker.summary}"
    )
    return [*kept[:place], summary, *kept[place:]]
