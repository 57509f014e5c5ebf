"""Settings from the environment (prefix `SUZUMIO_`), shared by every process of the platform."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from suzumio.contracts.subjects import Topology
from suzumio.platform.embedded.nats import SYNC_INTERVAL, SYNC_INTERVAL_PATTERN


class PlatformSettings(BaseSettings):
    """What every Suzumio process needs to find NATS, Postgres and its data directory.

    With `nats_url` / `database_url` unset, the embedded servers in `data_dir` are used (and
    started if none runs there yet); with them set, nothing embedded starts.
    """

    model_config = SettingsConfigDict(env_prefix="SUZUMIO_", extra="ignore")

    nats_url: str | None = None
    database_url: SecretStr | None = None
    data_dir: Path = Field(default=Path(".suzumio"), description="embedded servers' data")
    nats_sync_interval: str = Field(
        default=SYNC_INTERVAL,
        pattern=SYNC_INTERVAL_PATTERN,
        description="how often the embedded NATS server writes the event log to disk: a "
        "duration (500ms, 1s, 2m) or 'always' (each message); an OS crash or a power cut "
        "loses what it has not written (a process killed loses nothing)",
    )
    namespace: str = Field(default="", description="prefix of every stream and subject")
    replicas: int = Field(default=1, ge=1, le=5, description="stream replicas (3 in a cluster)")
    live_max_bytes: int = Field(
        default=-1,
        ge=-1,
        description="the LIVE stream's bytes in the NATS server's memory, the oldest going past "
        "it (-1: unbounded; JetStream reserves a bound in its memory store up front)",
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["auto", "json", "console"] = "auto"
    db_pool_max: int = Field(default=10, ge=1, le=200)
    secret_key: SecretStr | None = Field(
        default=None, description="Fernet key(s), comma-separated, current first"
    )
    cpu_policy: Literal["batch", "inherit"] = Field(
        default="batch",
        description="batch: Linux's SCHED_BATCH (a woken process does not preempt the one "
        "running); inherit: the policy the process was started with",
    )

    @field_validator("nats_url", "database_url", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # `SUZUMIO_NATS_URL=` in a shell or .env file means "not set", not "connect to ''".
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @field_validator("log_level", "log_format", "cpu_policy", mode="before")
    @classmethod
    def _any_case(cls, value: object) -> object:
        # People write DEBUG as often as debug; both mean the same.
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("namespace")
    @classmethod
    def _namespace_is_a_prefix(cls, value: str) -> str:
        # Checked here, not when `topology()` is first called: a wrong namespace is then one
        # line naming SUZUMIO_NAMESPACE (CLI and services alike), not a traceback.
        try:
            Topology(namespace=value)
        except ValidationError as exc:
            error = exc.errors()[0]
            raise ValueError(str(error.get("ctx", {}).get("error") or error["msg"])) from None
        return value

    def topology(self) -> Topology:
        return Topology(
            namespace=self.namespace, replicas=self.replicas, live_max_bytes=self.live_max_bytes
        )


class ServiceSettings(PlatformSettings):
    """A service process: the platform settings plus its health/metrics HTTP listener."""

    http_host: str = "127.0.0.1"
    http_port: int = Field(default=0, ge=0, le=65_535, description="0 picks a free port")
    drain_seconds: float = Field(default=8.0, gt=0, le=60, description="SIGTERM grace period")
    instance: str = Field(default="", description="replica name in logs; defaults to host:pid")

    @field_validator("secret_key")
    @classmethod
    def _fernet_keys(cls, value: SecretStr | None) -> SecretStr | None:
        # At start, not at the first secret sealed or token signed: a key that cannot be
        # used is then one line, not a traceback from the middle of a service's set-up (or,
        # in the tool-broker, which only derives a signing key from it, no error at all).
        if value is None:
            return None
        # Imported here: only a service given a key pays for `cryptography` at start.
        from cryptography.fernet import Fernet  # noqa: PLC0415

        keys = [k.strip() for k in value.get_secret_value().split(",") if k.strip()]
        if not keys:
            raise ValueError("holds no key (unset, <data dir>/secret.key is used)")
        for key in keys:
            try:
                Fernet(key.encode())
            except ValueError:
                raise ValueError(
                    "not Fernet keys (32 url-safe base64-encoded bytes each), comma-separated"
                ) from None
        return value

    def __init__(self, **values: Any) -> None:
        if values:  # built by code (tests, tools): a wrong value is that code's bug
            super().__init__(**values)
            return
        # Read from the environment alone (`python -m suzumio.<service>`): a wrong value is
        # the operator's to fix, so it is one line naming the variable (exit 2, as the CLI
        # does), not a traceback that reads like a bug.
        try:
            super().__init__()
        except (ValidationError, SettingsError) as exc:
            sys.stderr.write(f"error: {_explain(type(self), exc)}\n")
            raise SystemExit(2) from None


def _explain(settings: type[BaseSettings], exc: ValidationError | SettingsError) -> str:
    """What is wrong with the environment, naming each variable."""
    prefix = str(settings.model_config.get("env_prefix") or "")
    if isinstance(exc, SettingsError):  # a value that is not the JSON its field takes
        cause = f": {exc.__cause__}" if exc.__cause__ is not None else ""
        return f"{str(exc).splitlines()[0]} (variables {prefix}*){cause}"
    delimiter = settings.model_config.get("env_nested_delimiter") or None
    problems = []
    for error in exc.errors():
        names = [str(part) for part in error["loc"] if isinstance(part, str)]
        variable = prefix + (delimiter.join(names) if delimiter else names[0] if names else "")
        shown = error.get("input")
        field = settings.model_fields.get(names[0]) if names else None
        if field is not None and "SecretStr" in str(field.annotation):
            shown = "***"  # a wrong key may still be most of the right one
        elif isinstance(shown, str):
            from suzumio.platform.embedded.credentials import redact  # noqa: PLC0415 - rare

            shown = redact(shown)
        setting = ".".join(str(part) for part in error["loc"])
        problems.append(f"{variable.upper()} ({setting}): {error['msg']} (got {shown!r})")
    return "; ".join(problems)
