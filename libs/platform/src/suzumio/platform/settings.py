"""Settings from the environment (prefix `SUZUMIO_`), shared by every process of the platform."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from suzumio.contracts.subjects import Topology


class PlatformSettings(BaseSettings):
    """What every Suzumio process needs to find NATS, Postgres and its data directory.

    With `nats_url` / `database_url` unset, the embedded servers in `data_dir` are used (and
    started if none runs there yet); with them set, nothing embedded starts.
    """

    model_config = SettingsConfigDict(env_prefix="SUZUMIO_", extra="ignore")

    nats_url: str | None = None
    database_url: SecretStr | None = None
    data_dir: Path = Field(default=Path(".suzumio"), description="embedded servers' data")
    namespace: str = Field(default="", description="prefix of every stream and subject")
    replicas: int = Field(default=1, ge=1, le=5, description="stream replicas (3 in a cluster)")
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

    def topology(self) -> Topology:
        return Topology(namespace=self.namespace, replicas=self.replicas)


class ServiceSettings(PlatformSettings):
    """A service process: the platform settings plus its health/metrics HTTP listener."""

    http_host: str = "127.0.0.1"
    http_port: int = Field(default=0, ge=0, le=65_535, description="0 picks a free port")
    drain_seconds: float = Field(default=8.0, gt=0, le=60, description="SIGTERM grace period")
    instance: str = Field(default="", description="replica name in logs; defaults to host:pid")
