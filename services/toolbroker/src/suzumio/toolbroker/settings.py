from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import SettingsConfigDict

from suzumio.platform.settings import ServiceSettings

# What one activation may publish to LIVE on a replica, and start in tool calls: far past what
# a runner does at its default budget (90 model calls, each streaming its answer and asking
# for tools), and a bound on what a sandbox looping on those routes costs the NATS server's
# memory, the log, and a replica's memory. A profile may allow 10,000 model calls of up to 128
# tool calls each: its operator raises these with it.
LIVE_BUDGET = 16 * 1024 * 1024
LOG_BUDGET = 4 * 1024 * 1024 * 1024  # bytes an activation may have written to the log by calls
MAX_TOOL_CALLS = 50_000


class ToolbrokerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="SUZUMIO_", extra="ignore", populate_by_name=True)

    http_port: int = Field(default=8081, ge=0, le=65_535)
    http_host: str = Field(
        default="127.0.0.1",
        description="where sandboxes reach the broker; 0.0.0.0 when they run on other hosts",
    )
    lookback_hours: float = Field(
        default=24.0,
        gt=0,
        le=24 * 30,
        description="how much recent log a replica folds on start; older activations are "
        "looked up when their token is first seen",
    )
    # The same variables as the orchestrator's (SUZUMIO_MAX_ARTIFACT_BYTES, …): what a sandbox
    # may send back from `/workspace/out` through the broker (kubernetes).
    max_artifact_bytes: int = Field(default=100 * 1024 * 1024, ge=1)
    max_artifacts: int = Field(default=200, ge=0)
    max_body_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=1024,
        description="the largest request body, refused with 413 before it is read (stricter "
        "for small calls; output files are bounded by max_artifact_bytes instead)",
    )
    live_bytes_per_activation: int = Field(
        default=LIVE_BUDGET,
        ge=1,
        description="bytes of live output one activation may publish (on each replica); past "
        "them its live output stops, with one `state` chunk saying so (the history is the "
        "record). LIVE is held in the NATS server's memory",
    )
    max_tool_calls_per_activation: int = Field(
        default=MAX_TOOL_CALLS,
        ge=1,
        description="tool calls one activation may start (each is an event in the log); past "
        "them a start is refused (409 limit_reached), which ends the activation failed",
    )
    log_bytes_per_activation: int = Field(
        default=LOG_BUDGET,
        ge=1024,
        description="bytes one activation may have the broker write to the log through its "
        "history, compaction, checkpoint, ask and support calls (on each replica; a call "
        "counts its body, and at least 1 KiB); past them such a call is refused (409 "
        "limit_reached), which ends the activation failed. Each is an event in the log for "
        "good; the tool calls and the output are bounded on their own",
    )
    credential_refresh_seconds: float = Field(
        default=10.0,
        ge=0,
        le=3_600,
        description="an activation gets a provider's current key (`POST /runner/credentials`) "
        "at most once in this many seconds per provider, on each replica",
    )
    broker_socket: Path | None = Field(
        default=None,
        description="a Unix socket to serve the runner API on besides the port: docker "
        "sandboxes of network 'none' reach the broker through it (the orchestrator mounts it "
        "in, by the same variable, SUZUMIO_BROKER_SOCKET)",
    )
    # The orchestrator's variables: the endpoint of models that name no provider, which the
    # broker's model relay calls for sandboxes of network 'none'.
    model_base_url: str | None = Field(
        default=None,
        description="the model endpoint for agents whose model names no provider (relayed)",
        validation_alias=AliasChoices("SUZUMIO_MODEL_BASE_URL", "OPENAI_BASE_URL"),
    )
    model_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("SUZUMIO_MODEL_API_KEY", "OPENAI_API_KEY")
    )
    relay_allow_private_providers: bool = Field(
        default=False,
        description="the model relay calls a project's provider whose host resolves to a "
        "loopback, private or link-local address (a model server on this host or network): "
        "off, a project's admin could point it at the platform's own servers",
    )
    relay_read_timeout_seconds: float = Field(
        default=600.0,
        gt=0,
        le=3_600,
        description="the model relay: the longest wait for a provider's next bytes",
    )
    relay_call_seconds: float = Field(
        default=1_800.0,
        gt=0,
        le=86_400,
        description="the model relay: the longest a relayed call may take, answer and stream "
        "together (never longer than its activation's token)",
    )
    relay_max_calls_per_project: int = Field(
        default=64,
        ge=1,
        le=100_000,
        description="the model relay: relayed calls one project may have open at once on a "
        "broker replica (429 past it)",
    )
