"""Small value types shared by events, commands and the runner contract."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)


def _no_nul(value: str) -> str:
    # Postgres text and jsonb cannot hold NUL, and no person means one: refuse it at the edge
    # rather than let it reach the log and poison a projection.
    if "\x00" in value:
        raise ValueError("text must not contain NUL characters")
    return value


MAX_JSON_DEPTH = 100
"""How deep free-form JSON we store may nest (the object itself is level 1)."""


def _no_nul_json(value: Any) -> Any:
    # Walked without recursion, and bounded in depth: JSON nested near the interpreter's limit
    # made this walk raise RecursionError (a 500, not a refusal), and the log's readers parse a
    # message only 200 levels deep, so a payload nested ~195 levels fit in its command and its
    # event but not in what carries it on (the runner's input, a `take_signals` reply): a signal
    # accepted once and never deliverable. The tool-broker holds its own JSON to the same depth.
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _no_nul(item)
            continue
        if isinstance(item, dict):
            for key in item:
                _no_nul(str(key))
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"the JSON nests more than {MAX_JSON_DEPTH} levels")
        stack.extend((child, depth + 1) for child in children)
    return value


Clean = Annotated[str, AfterValidator(_no_nul)]
"""Any text we store: refuses NUL characters."""
CleanJson = Annotated[dict[str, Any], AfterValidator(_no_nul_json)]
"""A JSON object we store: refuses NUL characters in keys and strings, however deep."""
Name = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=200),
    AfterValidator(_no_nul),
]
Text = Annotated[str, StringConstraints(max_length=1_000_000), AfterValidator(_no_nul)]
ToolRef = Annotated[str, StringConstraints(max_length=200), AfterValidator(_no_nul)]
"""A tool's or a toolpack's name as an agent lists it."""
MAX_ENV_FACTS = 1_000
MAX_FACT_CHARS = 10_000
FactText = Annotated[str, StringConstraints(max_length=MAX_FACT_CHARS), AfterValidator(_no_nul)]
"""An environment fact's name or value (an agent holds at most `MAX_ENV_FACTS` of them)."""
MAX_PERMISSIONS = 500

MAX_PAYLOAD_BYTES = 256 * 1024
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)


def _small_json(value: dict[str, Any]) -> dict[str, Any]:
    # A payload rides along in events, in activation inputs and on the bus (whose messages are
    # capped at a few MB): bound it where it enters, not where it no longer fits.
    try:
        # NaN and infinities are not JSON: the bus would carry them as null, silently.
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        size = len(text.encode())
    except (RecursionError, TypeError, ValueError) as exc:
        raise ValueError("the payload is not a plain JSON object") from exc
    if size > MAX_PAYLOAD_BYTES:
        raise ValueError(f"the payload is {size} bytes as JSON; at most {MAX_PAYLOAD_BYTES}")
    return value


def _sane_instant(value: datetime) -> datetime:
    # The scheduler compares instants with its aware clock, and Postgres' timestamptz holds
    # them in UTC: a year that leaves 1..9999 once in UTC cannot even be stored.
    try:
        utc = value.astimezone(UTC)
    except OverflowError as exc:
        raise ValueError("the time is out of range once converted to UTC") from exc
    if not EARLIEST <= utc <= LATEST:
        raise ValueError("the time must lie between the years 2000 and 9999 (UTC)")
    return utc


Payload = Annotated[dict[str, Any], AfterValidator(_no_nul_json), AfterValidator(_small_json)]
"""A small JSON object (at most MAX_PAYLOAD_BYTES as compact JSON), free of NUL characters."""
Instant = Annotated[AwareDatetime, AfterValidator(_sane_instant)]
"""A moment with its timezone, in the years 2000..9999 (UTC); given back in UTC."""


class Priority(StrEnum):
    """When a signal becomes visible to the agent (DESIGN.md §6)."""

    P0 = "P0"  # cancel the live activation and restart with this signal first
    P1 = "P1"  # inject at the live activation's next tool boundary, else start one
    P2 = "P2"  # next activation start, ahead of routine work
    P3 = "P3"  # routine queued work


class SignalKind(StrEnum):
    USER_MESSAGE = "user.message"
    MESSAGE_CREATED = "message.created"
    APPROVAL_RESULT = "approval.result"
    ARTIFACT_READY = "artifact.ready"
    TIMER = "timer"
    NUDGE = "nudge"
    CUSTOM = "custom"


class Author(BaseModel):
    """Who wrote a message."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["user", "agent", "system"]
    id: str


def _unset(value: object) -> bool:
    return value is None


MIN_CONTEXT_WINDOW = 1_024
MAX_CONTEXT_WINDOW = 100_000_000
MAX_OUTPUT_TOKENS = 1_000_000


class ModelSpec(BaseModel):
    """Which model an agent calls, through which OpenAI-compatible provider settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")  # a typo is an error

    name: Name = Field(description="model name as the provider knows it")
    provider: Name | None = Field(
        default=None, description="provider settings id; none means the platform default"
    )
    # A figure left unset is left out of the JSON (`exclude_if`): a runner from before these
    # fields refuses unknown keys of a model spec, so an image built from it still reads the
    # input of an agent that sets none.
    context_window: int | None = Field(
        default=None,
        exclude_if=_unset,
        ge=MIN_CONTEXT_WINDOW,
        le=MAX_CONTEXT_WINDOW,
        description="the model's context window in tokens (compaction aims below it); none "
        "means the platform default (128,000)",
    )
    max_output_tokens: int | None = Field(
        default=None,
        exclude_if=_unset,
        ge=1,
        le=MAX_OUTPUT_TOKENS,
        description="the most the model may write in one reply: every call asks for this many "
        "tokens and a reply cut off at it is not asked again with more; none means the "
        "platform default (4,096, doubled on a cut-off reply up to 32,768)",
    )

    @model_validator(mode="after")
    def _output_fits(self) -> ModelSpec:
        if (
            self.context_window is not None
            and self.max_output_tokens is not None
            and self.max_output_tokens >= self.context_window
        ):
            raise ValueError("max_output_tokens must be smaller than context_window")
        return self


class ProjectLimits(BaseModel):
    """Concurrency limits the scheduler enforces for a project."""

    model_config = ConfigDict(frozen=True, extra="forbid")  # a typo is an error

    max_concurrent_activations: int = Field(default=8, ge=1, le=10_000)


class SignalOutcome(StrEnum):
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class ActivationReason(StrEnum):
    """Why the scheduler started an activation."""

    SIGNALS = "signals"
    PREEMPT = "preempt"  # a P0 signal cancelled the live one
    RETRY = "retry"
    NUDGE = "nudge"


Slug = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]
"""A short lowercase name used in URLs and references (`gpu-large`, `openai-main`)."""


class Role(StrEnum):
    """A member's role in a project; each role can do everything the ones below it can."""

    OWNER = "owner"  # + manage owners
    ADMIN = "admin"  # + agents, profiles, providers, mount grants, members, settings
    MEMBER = "member"  # + sessions, messages, signals, artifacts, replies
    VIEWER = "viewer"  # read everything in the project

    @property
    def rank(self) -> int:
        return _ROLE_RANK[self]

    def at_least(self, other: Role) -> bool:
        return self.rank >= other.rank


_ROLE_RANK = {Role.VIEWER: 0, Role.MEMBER: 1, Role.ADMIN: 2, Role.OWNER: 3}


class Backend(StrEnum):
    PROCESS = "process"
    DOCKER = "docker"
    KUBERNETES = "kubernetes"
    POOL = "pool"


class NetworkProfile(StrEnum):
    NONE = "none"  # no network at all: the broker (and the model) through a socket bound in
    EGRESS = "egress"  # outbound only (the tool-broker and model providers)
    FULL = "full"


# The backends that run a sandbox of the `none` network profile: its runner reaches the
# tool-broker through a Unix socket mounted into it, and its model through the broker's relay
# (the process backend only with bubblewrap, which gives it a network namespace of its own).
# A pod (kubernetes) shares no socket with the broker, and the pool isolates no network, so
# they refuse it (the session service when a profile is set, the orchestrator for one stored
# before).
NO_NETWORK_BACKENDS = frozenset({Backend.DOCKER, Backend.PROCESS})
NO_NETWORK_REFUSED = (
    "network 'none' needs the docker backend, or the process backend with bubblewrap (their "
    "sandboxes reach the tool-broker through a socket bound in, and their model through the "
    "broker); elsewhere use 'egress' (on kubernetes narrowed to the broker, DNS and the "
    "configured egress CIDRs)"
)


class ResourceLimits(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    cpus: float = Field(default=1.0, gt=0, le=128)
    memory_mb: int = Field(default=1_024, ge=64, le=1_048_576)
    disk_mb: int = Field(default=4_096, ge=16, le=10_485_760)
    pids: int = Field(default=512, ge=16, le=1_000_000)


class Timeouts(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    wall_clock_seconds: int = Field(default=3_600, ge=1, le=7 * 86_400)
    idle_seconds: int = Field(
        default=600,
        ge=1,
        le=7 * 86_400,
        description="the idle TTL of a warm session sandbox: a pool worker keeps the session's "
        "workspace (and resident runner) at most this long after its last activation, and "
        "never longer than its own --idle-ttl; the one-shot backends keep nothing warm",
    )


class LoopSettings(BaseModel):
    """The agent loop's limits for the activations of a runtime profile (DESIGN.md
    Appendix A); a field left unset (none) takes the platform's default."""

    model_config = ConfigDict(frozen=True, extra="forbid")  # a typo is an error

    max_model_calls: int | None = Field(
        default=None, ge=1, le=10_000, description="model calls per activation (default 90)"
    )
    max_parallel_tools: int | None = Field(
        default=None, ge=1, le=64, description="tool calls running at once (default 8)"
    )
    tool_timeout_seconds: float | None = Field(
        default=None,
        gt=0,
        le=7 * 86_400,
        description="a tool round's time limit (default 300); a call still gets the time it "
        "is itself allowed (shell.exec's timeout, an approval's wait) plus a margin",
    )
    max_retries: int | None = Field(
        default=None, ge=0, le=20, description="retries of a failing model (default 3)"
    )
    broker_retries: int | None = Field(
        default=None,
        ge=0,
        le=20,
        description="retries of a broker call that finds the broker unreachable or failing "
        "(default 5, ~6-9 s); the output's are at least 14",
    )
    ask_wait_seconds: float | None = Field(
        default=None, ge=0, le=300, description="ask_user's wait before checkpointing (120)"
    )
    approval_wait_seconds: float | None = Field(
        default=None, ge=0, le=300, description="a tool call's wait for its approval (120)"
    )

    def overrides(self) -> dict[str, int | float]:
        """The settings given, by the runner configuration's field names."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class RuntimeProfileSpec(BaseModel):
    """How to start an agent's sandbox (DESIGN.md §1: runtime profile)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Backend = Backend.PROCESS
    image: Clean | None = Field(default=None, max_length=500, description="docker/kubernetes")
    entry: tuple[Annotated[Clean, StringConstraints(max_length=1_000)], ...] = Field(
        default=(), max_length=64, description="command to run instead of the image's default"
    )
    pool: Slug | None = Field(default=None, description="worker pool, for backend 'pool'")
    limits: ResourceLimits = ResourceLimits()
    network: NetworkProfile = NetworkProfile.EGRESS
    timeouts: Timeouts = Timeouts()
    loop: LoopSettings = LoopSettings()


class EncryptedSecret(BaseModel):
    """A secret sealed with the platform's secret key (Fernet); never the plaintext."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ciphertext: str = Field(max_length=20_000)
    key_id: str = Field(max_length=64, description="fingerprint of the key that sealed it")


class ProviderSpec(BaseModel):
    """Settings of a model provider: where to call and with which (sealed) key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["openai", "anthropic"] = Field(
        default="openai", description="'openai' means any OpenAI-compatible endpoint"
    )
    base_url: Annotated[str, StringConstraints(pattern=r"^https?://[^\s\x00]+$", max_length=2_000)]
    model: Name
    fallbacks: tuple[ModelSpec, ...] = Field(default=(), max_length=16)
    api_key: EncryptedSecret | None = None


class WorkspaceMode(StrEnum):
    COPY = "copy"  # inputs are copied into the activation's workspace
    MOUNT = "mount"  # granted host directories are mounted


class ToolPolicy(StrEnum):
    ALLOW = "allow"
    ASK = "ask"  # an approval pending action first
    DENY = "deny"


class MountMode(StrEnum):
    READ_ONLY = "ro"
    READ_WRITE = "rw"


class AssetRef(BaseModel):
    """A file of an agent package, stored content-addressed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: Clean = Field(max_length=1_000)
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    size: int = Field(ge=0)


class PendingKind(StrEnum):
    QUESTION = "question"
    APPROVAL = "approval"
    ARTIFACT_REQUEST = "artifact_request"
