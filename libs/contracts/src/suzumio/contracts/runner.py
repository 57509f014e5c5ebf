"""The runner contract: `/activation/input.json` in, `/activation-output` back (DESIGN.md §7).

The runner in the sandbox depends on these models alone. They are versioned: a runner refuses an
input whose `schema_version` it does not know rather than guessing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import (
    ModelSpec,
    Priority,
    ResourceLimits,
    SignalKind,
    Slug,
    ToolPolicy,
)

RUNNER_CONTRACT_VERSION = 1
ASSETS_DIR = "assets"  # the agent package's assets, under the workspace


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class ProjectRef(_Frozen):
    id: Identifier
    name: str


class AgentSpec(_Frozen):
    id: Identifier
    role: str
    prompt: str
    model: ModelSpec
    fallbacks: tuple[ModelSpec, ...] = ()
    env_facts: dict[str, str] = Field(
        default_factory=dict,
        description="the agent package's facts about its environment, for the system prompt",
    )


class SessionRef(_Frozen):
    id: Identifier


class SignalSpec(_Frozen):
    id: Identifier
    kind: SignalKind
    priority: Priority
    payload: dict[str, Any] = Field(default_factory=dict)
    text: str | None = Field(default=None, description="the message text, for message signals")
    message_id: Identifier | None = Field(
        default=None, description="the message it announces (already in history if older)"
    )


class ActivationSpec(_Frozen):
    id: Identifier
    prompt: str = Field(default="", description="extra instructions for this activation")
    signals: tuple[SignalSpec, ...] = ()
    attempt: int = 1
    earlier_attempts: tuple[str, ...] = Field(
        default=(),
        max_length=1_000,
        description="the activations requested before with any of these signals, or handed"
        " one while they ran (a retry's earlier attempts): their entries in the history are"
        " work on these signals, not an answer to them",
    )
    summarized_message_ids: tuple[str, ...] = Field(
        default=(),
        max_length=1_000,
        description="the messages of these signals an earlier attempt's compaction archived:"
        " the history's summary holds them, so they are not given again at its end",
    )


class CompactionSettings(_Frozen):
    threshold_ratio: float = Field(default=0.5, gt=0, le=1)
    max_attempts_per_turn: int = Field(default=3, ge=1)
    tail_ratio: float = Field(default=0.2, gt=0, lt=1)
    min_tail_messages: int = Field(default=8, ge=0)


class RunnerConfig(_Frozen):
    max_model_calls: int = Field(default=90, ge=1)
    max_output_tokens: int = Field(default=4_096, ge=1)
    max_output_tokens_cap: int = Field(default=32_768, ge=1)
    context_window: int = Field(default=128_000, ge=1_024)
    max_parallel_tools: int = Field(default=8, ge=1)
    tool_timeout_seconds: float = Field(default=300, gt=0)
    wall_clock_seconds: float = Field(default=3_600, gt=0)
    max_retries: int = Field(default=3, ge=0)
    broker_retries: int = Field(
        default=5,
        ge=0,
        le=20,
        description="tries again of a broker call the broker does not answer, or answers 5xx "
        "(backing off 0.2 s doubling to 5 s); the output's own are at least 14",
    )
    ask_wait_seconds: float = Field(
        default=120, ge=0, le=300, description="how long ask_user waits before checkpointing"
    )
    approval_wait_seconds: float = Field(
        default=120, ge=0, le=300, description="how long a tool call waits for its approval"
    )
    compaction: CompactionSettings = CompactionSettings()


class ToolDefinition(_Frozen):
    """A model-facing tool: name, description and JSON Schema of its arguments."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    read_only: bool = False


class RunnerToolpackSpec(_Frozen):
    name: str
    tools: tuple[str, ...] = ()
    support_operations: tuple[str, ...] = ()


class ToolCall(_Frozen):
    id: str
    name: str
    arguments: str = Field(description="JSON text exactly as the model produced it")


class AgentHistoryMessage(_Frozen):
    """One entry of the session's active history, rendered to model messages by the runner."""

    id: str | None = Field(default=None, description="the history entry's message id")
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    created_at: datetime | None = None
    activation_id: str | None = Field(
        default=None,
        description="the activation that wrote it (agent entries): a retry tells its earlier"
        " attempts' work from an earlier activation's answer",
    )


class MountSpec(_Frozen):
    """A granted directory as the sandbox sees it."""

    path: str
    writable: bool = False


class CheckpointRef(_Frozen):
    id: Identifier
    created_at: datetime
    data: dict[str, Any] = Field(default_factory=dict)


class FileRef(_Frozen):
    """A file of the artifacts' object store (`blob_name(sha256)` in `ARTIFACTS_BUCKET`) at a
    path relative to a workspace directory (`/workspace/in` or `/workspace/out`)."""

    path: str = Field(
        min_length=1, max_length=1_000, description="relative, `/`-separated, no `.` or `..`"
    )
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)

    @field_validator("path")
    @classmethod
    def _relative(cls, path: str) -> str:
        if not placeable(path):
            raise ValueError("a relative path of named parts")
        return path


def placeable(path: str) -> bool:
    """Whether a workspace directory can hold a file at `path`: relative, `/`-separated,
    every part a name (no `.`, `..` or empty part), no NUL or backslash."""
    parts = path.split("/")
    return not ("\x00" in path or "\\" in path or any(p in {"", ".", ".."} for p in parts))


class InputFile(FileRef):
    """One of the session's artifacts, to fetch from the broker by its id."""

    artifact_id: Identifier


class FileExchange(_Frozen):
    """Files exchanged through the tool-broker by the runner itself, for sandboxes that share
    neither a disk nor the platform's NATS with it (DESIGN.md §8, kubernetes): the session's
    artifacts to fetch into `/workspace/in` before the loop, and the limits of what to send
    back from `/workspace/out` afterwards (the broker enforces its own as well)."""

    inputs: tuple[InputFile, ...] = ()
    max_output_files: int = Field(default=0, ge=0)
    max_output_bytes: int = Field(default=0, ge=0)


class RunnerActivationInput(_Frozen):
    """Everything the runner needs, written read-only to `/activation/input.json`."""

    schema_version: Literal[1] = 1
    project: ProjectRef
    agent: AgentSpec
    session: SessionRef
    activation: ActivationSpec
    workspace: str = "/workspace"
    controller_url: str = Field(description="base URL of the tool-broker")
    controller_socket: str | None = Field(
        default=None,
        max_length=200,
        description="network 'none': the Unix socket (a path in the sandbox) the tool-broker "
        "is reached through — `controller_url` then only names it — and the model calls go "
        "through the broker's relay (`/runner/models/...`) with the token as their key",
    )
    token: str = Field(description="signed, short-lived token scoped to this activation")
    runner: RunnerConfig = RunnerConfig()
    tools: tuple[ToolDefinition, ...] = ()
    toolpacks: tuple[RunnerToolpackSpec, ...] = ()
    permissions: dict[str, ToolPolicy] = Field(
        default_factory=dict, description="per tool: allow, ask (approval first) or deny"
    )
    default_permission: ToolPolicy = ToolPolicy.ALLOW
    mounts: tuple[MountSpec, ...] = ()
    allow_private_network: bool = Field(
        default=False, description="web.fetch may reach loopback/private addresses"
    )
    history: tuple[AgentHistoryMessage, ...] = ()
    checkpoint: CheckpointRef | None = None
    files: FileExchange | None = Field(
        default=None,
        description="set when the sandbox shares no disk with the platform (kubernetes): the "
        "runner itself brings these files into `in/` and `out/`'s files back, through the broker",
    )
    assets: tuple[FileRef, ...] = Field(
        default=(),
        description="the agent package's assets: on every backend the runner fetches them "
        f"through the broker into `{ASSETS_DIR}/` (replacing whatever is there) before the loop",
    )


class RunnerActivationOutput(_Frozen):
    """The final result, POSTed to `/activation-output`: the only way a result exists."""

    # 2: a `FinalCall` (contracts.broker), which brings the runner's last history entries and
    # live batch along; a broker older than it refuses the 2, and the runner sends them apart.
    schema_version: Literal[1, 2] = 1
    text: str = Field(max_length=1_000_000, description="as the output's event holds it")
    usage: dict[str, Any] = Field(default_factory=dict)
    reason: Literal["completed", "budget_exhausted", "waiting", "failed"] = "completed"


def dispatch_id(activation_id: str, attempt: int) -> str:
    """Names one attempt's dispatch: its `Nats-Msg-Id` and the pool backend's sandbox id."""
    return f"{activation_id}.{attempt}"


class ActivationDispatch(_Frozen):
    """A unit of work on `act.<pool>` for warm workers (the QueueConsumer channel).

    It carries the sandbox's whole environment, provider keys included, and the input's token:
    the ACTIVATIONS stream lives inside the platform's NATS, which only the services and the
    workers may reach, and a dispatch leaves the stream when a worker acks it (the pool
    backend's module documentation says more).
    """

    attempt: int = Field(default=1, ge=1)
    deadline: datetime = Field(description="wall-clock instant after which the work is void")
    input: RunnerActivationInput
    pool: Slug = "default"
    env: dict[str, str] = Field(
        default_factory=dict,
        repr=False,
        description="the sandbox's whole environment (ids, model endpoints, provider keys); "
        "secret: a worker hands it to the runner and never logs it",
    )
    affinity_key: Identifier | None = Field(
        default=None,
        description="a warm workspace kept under this key (the session) is reused by a worker "
        "that still holds it; none: a fresh workspace",
    )
    inputs: tuple[FileRef, ...] = Field(
        default=(), description="the session's artifacts, copied into `/workspace/in` first"
    )
    max_output_files: int = Field(
        default=0, ge=0, description="files of `/workspace/out` to store afterwards (0: none)"
    )
    max_output_bytes: int = Field(default=0, ge=0, description="larger files are left out")
    limits: ResourceLimits | None = Field(
        default=None,
        description="the runtime profile's limits, for the worker's sandbox (none: a dispatch "
        "from an orchestrator that sent none; the worker's runner is then unlimited)",
    )
    idle_seconds: int | None = Field(
        default=None,
        ge=1,
        description="the profile's idle TTL: a worker keeps the session warm at most this long "
        "after this activation (and never past its own --idle-ttl); none: its own alone",
    )

    @property
    def dispatch_id(self) -> str:
        return dispatch_id(self.input.activation.id, self.attempt)


PoolStatusKind = Literal["started", "heartbeat", "exited", "refused"]
PoolStatusReason = Literal[
    "",  # started, heartbeat
    "exited",  # the runner ended by itself; exit_code says why
    "cancelled",  # stopped on `pool.cancel` (exited), or cancelled before it started (refused)
    "timeout",  # stopped at the dispatch's deadline
    "killed",  # ended by a signal the worker did not send
    "oom",  # killed by the kernel at the run's memory limit (its cgroup says so)
    "shutdown",  # stopped because the worker was shutting down
    "spawn_failed",  # the runner process could not be started
    "deadline",  # refused: the deadline passed before it could start
    "invalid",  # refused: the worker could not read the dispatch
    "busy",  # refused: sent to this worker (affinity), it had no slot free in time, or stopped
    "claimed",  # refused: a worker started it before (it was handed out again after that)
]


class PoolStatus(_Frozen):
    """A worker's word about one dispatch, on `pool.status.<activation_id>` (core NATS)."""

    kind: PoolStatusKind
    dispatch_id: str
    activation_id: Identifier
    attempt: int = Field(ge=1)
    worker_id: str
    pool: str
    at: datetime
    reason: PoolStatusReason = ""
    exit_code: int | None = Field(default=None, description="exited: the runner's exit code")
    signal: int | None = Field(default=None, description="exited: the signal that ended it")
    warm: bool = Field(
        default=False, description="started: in a warm workspace; exited: the workspace is kept"
    )
    resident: bool = Field(
        default=False,
        description="started: on the session's resident runner, which ran an earlier activation",
    )
    detail: str = Field(default="", max_length=4_000, description="the runner's last log lines")
    deadline: datetime | None = Field(default=None, description="started: the dispatch's")
    outputs: tuple[FileRef, ...] = Field(
        default=(), description="exited: the files of `/workspace/out` it stored"
    )
    acked: bool = Field(
        default=False,
        description="exited: the server confirmed the worker's ack of the dispatch before this "
        "was sent, so its message has left the work queue",
    )


class PoolCancel(_Frozen):
    """Body of `pool.cancel.<activation_id>`: stop that dispatch, or every one of it."""

    dispatch_id: str | None = None


class PoolListRequest(_Frozen):
    """Body of a `pool.list` request that asks about one dispatch: answers name only its
    exit among the recent ones (an empty body asks about everything)."""

    dispatch_id: str | None = None


MAX_WARM_KEYS = 1024  # in a presence beat: a worker with more warm sessions names its newest


class PoolWorkerInfo(_Frozen):
    """A worker's presence beat (`pool.worker.<id>`) and its answer to `pool.list`."""

    worker_id: str
    pool: str
    capacity: int = Field(ge=1)
    at: datetime
    running: tuple[PoolStatus, ...] = Field(default=(), description="the `started` of each run")
    exited: tuple[PoolStatus, ...] = Field(default=(), description="recent ends (`pool.list`)")
    warm_sessions: int = 0
    takes_routed: bool = Field(
        default=False, description="its own consumer is bound: dispatches may be routed to it"
    )
    warm_keys: tuple[str, ...] = Field(
        default=(),
        description="the affinity keys of the sessions it keeps warm (presence beats), at most "
        "`MAX_WARM_KEYS`: the orchestrator routes their next dispatches to this worker",
    )
