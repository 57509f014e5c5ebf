"""The tool-broker's HTTP API as the runner sees it (DESIGN.md §7).

Every request carries the activation's token (`Authorization: Bearer …`). Requests are
idempotent where a runner may retry them: a tool call is keyed by its call id, a history entry
by its message id, a pending action and a checkpoint by theirs.

Text that ends up in the log refuses NUL characters and lone surrogates here, as the commands
and events it becomes do (`Clean`): a call carrying one is a 422 before it has any effect, not
a failure halfway.
Live chunks are never stored, so they take any text.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from suzumio.contracts.ids import Identifier
from suzumio.contracts.runner import RunnerActivationOutput, SignalSpec
from suzumio.contracts.values import Clean, CleanJson, Name, Payload, PendingKind, Priority

Digest = str  # lowercase hex SHA-256
ApprovedCall = Annotated[
    Clean | None,
    Field(
        max_length=1_000_000,
        description="the tool call's arguments as the model wrote them (JSON text), when the "
        "agent's policy asks a person to approve the tool: the broker finds the approval by "
        "them, and refuses the call without one (`suzumio.contracts.policies`)",
    ),
]
# Sizes and durations of the tool-call audit land in `integer` columns of its read model: a
# larger one would be stored in the log and then parked by the projection (the call missing
# from the audit). No real call comes near it (a result is cut to 200 000 characters).
AUDIT_INT_MAX = 2**31 - 1


def _not_p0(value: Priority) -> Priority:
    if value is Priority.P0:
        raise ValueError("an agent cannot send P0 work: P0 cancels the live activation")
    return value


AgentPriority = Annotated[Priority, AfterValidator(_not_p0)]


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _false(value: object) -> bool:
    return value is False


class ToolCallStart(_Body):
    call_id: Clean = Field(min_length=1, max_length=200)
    tool: Clean = Field(min_length=1, max_length=200)
    arguments_digest: Digest = Field(pattern=r"^[0-9a-f]{64}$")
    arguments_size: int = Field(ge=0, le=AUDIT_INT_MAX)
    read_only: bool = Field(
        default=False,
        description="the tool changes nothing (its definition says so: file.read, file.search, "
        "web.fetch, a toolpack's read-only tools): its success is no effect for the nudge rule",
        # Left out when false: a broker from before the field refuses unknown fields (422),
        # and a runner image is often newer than the broker it calls.
        exclude_if=_false,
    )


class ToolCallFinish(_Body):
    call_id: Clean = Field(min_length=1, max_length=200)
    status: Literal["ok", "error", "denied", "timeout", "cancelled"]
    result_digest: Digest | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    result_size: int = Field(default=0, ge=0, le=AUDIT_INT_MAX)
    duration_ms: int = Field(ge=0, le=AUDIT_INT_MAX)
    error: Clean = Field(default="", max_length=2_000)


class Recorded(_Body):
    recorded: bool = Field(description="false when it was recorded before (a retry)")


class HistoryToolCallIn(_Body):
    id: Clean = Field(max_length=200)
    name: Clean = Field(max_length=200)
    arguments: Clean = Field(max_length=1_000_000)


class HistoryEntryIn(_Body):
    message_id: Identifier
    role: Literal["assistant", "tool", "user"]
    text: Clean = Field(default="", max_length=1_000_000)
    tool_calls: tuple[HistoryToolCallIn, ...] = Field(default=(), max_length=128)
    tool_call_id: Clean | None = Field(default=None, max_length=200)
    name: Clean | None = Field(default=None, max_length=200)


class HistoryAppend(_Body):
    entries: tuple[HistoryEntryIn, ...] = Field(min_length=1, max_length=256)


class CompactionMarker(_Body):
    marker_id: Identifier
    summary: Clean = Field(min_length=1, max_length=1_000_000)
    archived_from: Identifier = Field(description="first archived history entry (message id)")
    archived_through: Identifier = Field(description="last archived history entry")
    archived_ids: tuple[Identifier, ...] = Field(
        default=(), max_length=10_000, description="every archived entry, in the runner's order"
    )
    tokens_before: int = Field(default=0, ge=0)
    tokens_after: int = Field(default=0, ge=0)


class StreamChunk(_Body):
    kind: Literal["text", "tool_progress", "state"]
    text: str = Field(default="", max_length=100_000)
    data: dict[str, Any] = Field(default_factory=dict)


class StreamBatch(_Body):
    chunks: tuple[StreamChunk, ...] = Field(min_length=1, max_length=1_000)
    batch: int | None = Field(
        default=None,
        ge=0,
        description="the batch's number within its activation: a batch sent again (a retry "
        "after a lost reply) is published once",
    )


class FinalCall(RunnerActivationOutput):
    """`POST /activation-output` with what the runner still had to send: the last turn's
    history entries and the last live batch, so an activation that needs no tool ends in one
    call. The broker handles them as the separate calls would, the entries first: they are
    appended, the batch published, then the output recorded; a call refused for its entries
    (too large, the session closed) has published nothing."""

    schema_version: Literal[1, 2] = 2
    text: Clean = Field(max_length=1_000_000, description="as the output's event holds it")
    usage: CleanJson = Field(default_factory=dict)
    history: tuple[HistoryEntryIn, ...] = Field(default=(), max_length=256)
    live: StreamBatch | None = None


MAX_RECEIVED = 10_000  # as `TakeSignals.received`


class SignalsTake(_Body):
    """`POST /runner/signals`: the signals the runner has already (by id), so they are not
    handed over again. In a body, as a query string they outgrew a URL: ~350 ids behind an h11
    server's 16 KB request head, ~3,000 in httpx's own URL bound."""

    received: tuple[Identifier, ...] = Field(default=(), max_length=MAX_RECEIVED)


class SignalsTaken(_Body):
    signals: tuple[SignalSpec, ...] = ()


class AskRequest(_Body):
    pending_action_id: Identifier
    kind: PendingKind = PendingKind.QUESTION
    prompt: Clean = Field(min_length=1, max_length=20_000)
    options: tuple[Clean, ...] = Field(default=(), max_length=50)
    paths: tuple[Clean, ...] = Field(default=(), max_length=100)
    timeout_seconds: int = Field(default=3_600, ge=1, le=30 * 86_400)
    wait_seconds: float = Field(
        default=0,
        ge=0,
        le=300,
        description="how long the request waits for the answer; 0 returns at once, so the "
        "activation can checkpoint and end (the answer then arrives as a signal)",
    )
    approved_call: ApprovedCall = None
    tool: Clean | None = Field(
        default=None,
        max_length=200,
        description="kind approval: the tool whose call (`approved_call`, required with it) a "
        "person is asked to approve; the id must be one `approval_id` gives for them, and the "
        "broker words the prompt itself",
    )


class AskOutcome(_Body):
    pending_action_id: Identifier
    status: Literal["pending", "answered", "expired", "cancelled"]
    answer: str = ""
    approved: bool | None = None
    artifact_ids: tuple[Identifier, ...] = ()


class CheckpointPut(_Body):
    checkpoint_id: Identifier
    data: CleanJson
    approved_call: ApprovedCall = None


class SupportCall(_Body):
    operation: str = Field(min_length=1, max_length=200)
    arguments: dict[str, Any] = Field(default_factory=dict)
    request_id: str = Field(
        min_length=1,
        max_length=200,
        description="unique per call within the activation (the tool call id): ids of what "
        "the operation creates derive from it, so a retried call creates nothing twice",
    )
    approved_call: ApprovedCall = None


class SupportResult(_Body):
    result: dict[str, Any] = Field(default_factory=dict)


class MessageSend(_Body):
    """`core` support operation `message.send`: a message to another session of the project."""

    session_id: Identifier
    text: Clean = Field(min_length=1, max_length=1_000_000)
    priority: AgentPriority = Priority.P2


class SignalRecord(_Body):
    """`core` support operation `signal.record`: pending work for this session's agent."""

    kind: Clean = Field(default="custom", max_length=100)
    payload: Payload = Field(default_factory=dict)
    priority: AgentPriority = Priority.P3
    delay_seconds: float = Field(default=0, ge=0, le=365 * 86_400)


class CredentialRequest(_Body):
    """`POST /runner/credentials`: the current key of the provider a model of the activation's
    agent is called through — asked after the provider refused the key the runner has (401),
    since a user may have replaced it while the activation ran."""

    model: Name = Field(description="the model's name, as in the agent's `model` or `fallbacks`")
    provider: Name | None = Field(
        default=None,
        description="the model's provider id; none (the platform's default endpoint) is never "
        "answered: its key is the platform's, not the project's",
    )
    base_url: str | None = Field(
        default=None,
        max_length=2_000,
        description="the endpoint the runner calls the model at: a key is answered only while "
        "the provider still names this endpoint (a key set for a new endpoint never goes to "
        "the old one, which may be the one refusing)",
    )


class CredentialAnswer(_Body):
    """The provider's key as its project holds it now, opened for the sandbox (never cached:
    `Cache-Control: no-store`)."""

    provider: Name
    # No length bound here: a bound the broker's own answer failed would put the key in a
    # validation error's text (the gateway stores at most 10,000 characters anyway).
    api_key: str = Field(min_length=1)
