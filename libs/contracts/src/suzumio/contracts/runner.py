"""The runner contract: `/activation/input.json` in, `/activation-output` back (DESIGN.md §7).

The runner in the sandbox depends on these models alone. They are versioned: a runner refuses an
input whose `schema_version` it does not know rather than guessing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import ModelSpec, Priority, SignalKind, ToolPolicy

RUNNER_CONTRACT_VERSION = 1


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


class CompactionSettings(_Frozen):
    threshold_ratio: float = Field(default=0.5, gt=0, le=1)
    max_attempts_per_turn: int = Field(default=3, ge=0)
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


class MountSpec(_Frozen):
    """A granted directory as the sandbox sees it."""

    path: str
    writable: bool = False


class CheckpointRef(_Frozen):
    id: Identifier
    created_at: datetime
    data: dict[str, Any] = Field(default_factory=dict)


class RunnerActivationInput(_Frozen):
    """Everything the runner needs, written read-only to `/activation/input.json`."""

    schema_version: Literal[1] = 1
    project: ProjectRef
    agent: AgentSpec
    session: SessionRef
    activation: ActivationSpec
    workspace: str = "/workspace"
    controller_url: str = Field(description="base URL of the tool-broker")
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


class RunnerActivationOutput(_Frozen):
    """The final result, POSTed to `/activation-output`: the only way a result exists."""

    schema_version: Literal[1] = 1
    text: str
    usage: dict[str, Any] = Field(default_factory=dict)
    reason: Literal["completed", "budget_exhausted", "waiting", "failed"] = "completed"


class ActivationDispatch(_Frozen):
    """A unit of work on `act.<pool>` for warm workers (the QueueConsumer channel)."""

    attempt: int = Field(default=1, ge=1)
    deadline: datetime = Field(description="wall-clock instant after which the work is void")
    input: RunnerActivationInput
