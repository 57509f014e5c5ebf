"""Request and response bodies of the REST API."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, StringConstraints, field_validator

from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import (
    MAX_ENV_FACTS,
    MAX_PERMISSIONS,
    AssetRef,
    Clean,
    FactText,
    Instant,
    ModelSpec,
    MountMode,
    Name,
    Payload,
    PendingKind,
    Priority,
    ProjectLimits,
    Role,
    RuntimeProfileSpec,
    SignalKind,
    Slug,
    Text,
    ToolPolicy,
    ToolRef,
    WorkspaceMode,
)
from suzumio.platform.logging import secret_name

KeyId = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]{8,32}$")]


class In(BaseModel):
    """Request bodies refuse fields they do not know: a typo is an error, not a no-op."""

    model_config = ConfigDict(extra="forbid")


class Out(BaseModel):
    pass


# -- users and keys ---------------------------------------------------------------------------
class UserIn(In):
    name: Name
    email: Clean | None = Field(default=None, max_length=320, pattern=r"^[^@\s]+@[^@\s]+$")
    admin: bool = False


class UserOut(Out):
    id: str
    name: str
    email: str | None
    admin: bool
    created_at: datetime


class UserWithKey(UserOut):
    api_key: str = Field(description="the user's first API key; shown this once only")


class ApiKeyIn(In):
    name: Clean = Field(default="", max_length=200)
    expires_at: Instant | None = Field(
        default=None, description="when the key stops working; with a timezone, in the future"
    )

    @field_validator("expires_at")
    @classmethod
    def _in_the_future(cls, value: datetime | None) -> datetime | None:
        if value is not None and value <= datetime.now(UTC):
            raise ValueError("the key would have expired already")
        return value


class ApiKeyOut(Out):
    key_id: str
    name: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class ApiKeyWithSecret(ApiKeyOut):
    api_key: str = Field(description="the key itself; shown this once only")


# -- projects -----------------------------------------------------------------------------
class ProjectIn(In):
    name: Name
    limits: ProjectLimits = ProjectLimits()


class ProjectPatch(In):
    name: Name | None = None
    limits: ProjectLimits | None = None


class ProjectOut(Out):
    id: str
    name: str
    owner_id: str
    limits: ProjectLimits
    role: Role = Field(description="the caller's role in the project")
    created_at: datetime
    updated_at: datetime


class MemberIn(In):
    role: Role


class MemberOut(Out):
    user_id: str
    role: Role
    since: datetime


class RuntimeProfileOut(Out):
    name: str
    spec: RuntimeProfileSpec
    updated_at: datetime


_HEADER_TOKEN = re.compile(r"[\x21-\x7e]*")


class ProviderIn(In):
    kind: Literal["openai", "anthropic"] = "openai"
    base_url: Clean = Field(pattern=r"^https?://[^\s\x00]+$", max_length=2_000)
    model: Name
    fallbacks: list[ModelSpec] = Field(default_factory=list, max_length=16)
    api_key: SecretStr | None = Field(
        default=None,
        max_length=10_000,
        description="write-only; omitted: the stored key stays; never returned",
    )
    clear_api_key: bool = False

    @field_validator("api_key")
    @classmethod
    def _sendable_key(cls, value: SecretStr | None) -> SecretStr | None:
        # The key goes in an HTTP header (`Authorization: Bearer …`): a character a header
        # cannot carry — a pasted newline, a space, anything not ASCII — would fail every call
        # with this provider, far from here.
        if value is not None and not _HEADER_TOKEN.fullmatch(value.get_secret_value()):
            raise ValueError(
                "the key must be printable ASCII without spaces (no line break, no tab)"
            )
        return value

    @field_validator("base_url")
    @classmethod
    def _no_credentials(cls, value: str) -> str:
        # The URL is shown to every viewer of the project and kept unsealed in the log: a key
        # belongs in `api_key` (write-only, sealed), never in the URL.
        parts = urlsplit(value)
        if "@" in parts.netloc:
            raise ValueError("no user or password in the URL: put the key in api_key")
        names = {name for name, _ in parse_qsl(parts.query, keep_blank_values=True)}
        if any(secret_name(n) or n.lower() in SECRET_QUERY_NAMES for n in names):
            raise ValueError("no key or token in the URL's query: put the key in api_key")
        return value


# Query parameters that carry credentials besides the secret-named ones (`?key=` is Google's,
# `?sig=` Azure's SAS...).
SECRET_QUERY_NAMES = frozenset({"key", "sig", "signature", "auth", "code"})


class ProviderOut(Out):
    name: str
    kind: str
    base_url: str
    model: str
    fallbacks: list[ModelSpec]
    api_key_set: bool
    updated_at: datetime


class MountGrantIn(In):
    host_path: Clean = Field(min_length=1, max_length=4_096)
    target: Clean = Field(min_length=1, max_length=1_000)
    mode: MountMode = MountMode.READ_ONLY
    agent_id: Identifier | None = None


class MountGrantOut(Out):
    id: str
    project_id: str
    agent_id: str | None
    host_path: str
    target: str
    mode: MountMode
    created_at: datetime


# -- agents -------------------------------------------------------------------------------
class AgentIn(In):
    name: Name
    role: Name
    prompt: Text = ""
    model: ModelSpec
    fallbacks: list[ModelSpec] = Field(default_factory=list, max_length=16)
    tools: list[ToolRef] = Field(default_factory=list, max_length=200)
    toolpacks: list[ToolRef] = Field(default_factory=list, max_length=100)
    runtime_profile: Slug | None = None
    description: Clean = Field(default="", max_length=10_000)
    permissions: dict[ToolRef, ToolPolicy] = Field(default_factory=dict, max_length=MAX_PERMISSIONS)
    env_facts: dict[FactText, FactText] = Field(default_factory=dict, max_length=MAX_ENV_FACTS)
    workspace_mode: WorkspaceMode = WorkspaceMode.COPY


class AgentPatch(In):
    name: Name | None = None
    role: Name | None = None
    prompt: Text | None = None
    model: ModelSpec | None = None
    fallbacks: list[ModelSpec] | None = Field(default=None, max_length=16)
    tools: list[ToolRef] | None = Field(default=None, max_length=200)
    toolpacks: list[ToolRef] | None = Field(default=None, max_length=100)
    runtime_profile: Slug | None = Field(
        default=None, description="null sets it back to none: the platform's default backend"
    )
    description: Clean | None = Field(default=None, max_length=10_000)
    permissions: dict[ToolRef, ToolPolicy] | None = Field(default=None, max_length=MAX_PERMISSIONS)
    env_facts: dict[FactText, FactText] | None = Field(default=None, max_length=MAX_ENV_FACTS)
    workspace_mode: WorkspaceMode | None = None


class AgentOut(Out):
    id: str
    project_id: str
    name: str
    role: str
    prompt: str
    description: str
    model: ModelSpec
    fallbacks: list[ModelSpec]
    tools: list[str]
    toolpacks: list[str]
    permissions: dict[str, ToolPolicy]
    env_facts: dict[str, str]
    assets: list[AssetRef]
    workspace_mode: WorkspaceMode
    runtime_profile: str | None
    disabled: bool
    created_at: datetime
    updated_at: datetime


class DisableIn(In):
    reason: Clean = Field(default="", max_length=2_000)


# -- sessions -----------------------------------------------------------------------------
class SessionIn(In):
    agent_id: Identifier
    title: Clean = Field(default="", max_length=500)


class SessionOut(Out):
    id: str
    project_id: str
    agent_id: str
    title: str
    status: Literal["active", "closed"]
    message_count: int
    last_message_at: datetime | None
    opened_at: datetime
    closed_at: datetime | None


class CloseIn(In):
    reason: Clean = Field(default="", max_length=2_000)


class CancelIn(In):
    reason: Clean = Field(default="", max_length=500, description="recorded with the cancel")


class MessageIn(In):
    text: Text = Field(min_length=1)
    priority: Priority | None = Field(default=None, description="P1 unless set (DESIGN §6)")


class Author(Out):
    kind: str
    id: str


class MessageOut(Out):
    id: str
    session_id: str
    version: int
    author: Author
    role: str
    text: str
    created_at: datetime


class MessagePosted(Out):
    message_id: str
    signal_id: str
    session_id: str
    position: int = Field(description="log position of the write (for `min_position`)")


class SignalIn(In):
    """Work for the agent that is not a message. Messages, approvals and files reach it through
    their own routes, so only custom work and timers are recorded here."""

    kind: Literal[SignalKind.CUSTOM, SignalKind.TIMER] = SignalKind.CUSTOM
    priority: Priority = Priority.P3
    payload: Payload = Field(default_factory=dict, description="at most 256 KiB as compact JSON")
    not_before: Instant | None = Field(
        default=None, description="with a timezone, in the years 2000..9999 (UTC)"
    )


class SignalOut(Out):
    id: str
    session_id: str
    agent_id: str
    kind: str
    priority: Priority
    status: str
    payload: dict[str, Any]
    message_id: str | None
    not_before: datetime | None
    activation_id: str | None
    reason: str
    created_at: datetime
    updated_at: datetime


class ActivationOut(Out):
    id: str
    session_id: str
    agent_id: str
    status: str
    reason: str
    attempt: int
    signal_ids: list[str]
    cancel_requested: bool
    backend: str | None
    exit_code: int | None
    output_text: str | None
    usage: dict[str, Any] | None
    end_reason: str | None
    requested_at: datetime
    started_at: datetime | None
    ended_at: datetime | None


class ToolCallOut(Out):
    call_id: str
    tool: str
    status: str
    arguments_digest: str
    arguments_size: int
    result_digest: str | None
    result_size: int | None
    duration_ms: int | None
    error: str | None
    started_at: datetime
    finished_at: datetime | None


# -- artifacts and pending actions ------------------------------------------------------------
class ArtifactOut(Out):
    id: str
    project_id: str
    session_id: str | None
    path: str
    sha256: str
    size: int
    content_type: str
    source: str
    created_at: datetime


class Uploaded(Out):
    items: list[ArtifactOut]


class PendingActionOut(Out):
    id: str
    session_id: str
    activation_id: str | None
    kind: PendingKind
    prompt: str
    options: list[str]
    paths: list[str]
    status: Literal["open", "answered", "expired", "cancelled"]
    answer: str | None
    approved: bool | None
    artifact_ids: list[str] | None
    answered_by: str | None
    created_at: datetime
    expires_at: datetime
    closed_at: datetime | None


class ReplyIn(In):
    answer: Clean = Field(default="", max_length=100_000)
    approved: bool | None = None
    artifact_ids: list[Identifier] = Field(default_factory=list, max_length=100)


# -- cluster ------------------------------------------------------------------------------
class ServiceSeen(Out):
    service: str
    instance: str
    http: str | None = None
    started_at: float
    seen_at: float
    draining: bool = False


class ProjectionStatus(Out):
    version: int
    position: int
    lag: int
    rebuilt_at: datetime | None


class StreamStatus(Out):
    messages: int
    bytes: int
    consumers: int
    last_seq: int


class ClusterStatus(Out):
    services: list[ServiceSeen]
    projections: dict[str, ProjectionStatus]
    streams: dict[str, StreamStatus]
    backends: list[dict[str, Any]] = Field(default_factory=list)
