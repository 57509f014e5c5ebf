from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, PrivateAttr, SecretStr
from pydantic_settings import SettingsConfigDict

from suzumio.contracts.values import Backend
from suzumio.orchestrator.backends.docker_settings import DockerSettings
from suzumio.orchestrator.backends.kubernetes_render import KubernetesSettings
from suzumio.orchestrator.backends.pool import PoolSettings
from suzumio.orchestrator.backends.process import ProcessSettings
from suzumio.orchestrator.bounds import SandboxBounds
from suzumio.platform.settings import ServiceSettings


class OrchestratorSettings(ServiceSettings):
    """Nested backend settings come from `SUZUMIO_<BACKEND>__<FIELD>`, e.g.
    `SUZUMIO_DOCKER__IMAGE`, `SUZUMIO_KUBERNETES__NAMESPACE`, `SUZUMIO_POOL__DEFAULT_POOL`."""

    model_config = SettingsConfigDict(
        env_prefix="SUZUMIO_", env_nested_delimiter="__", populate_by_name=True
    )

    http_port: int = Field(default=8093, ge=0, le=65_535)
    process: ProcessSettings = Field(default_factory=ProcessSettings)
    docker: DockerSettings = Field(default_factory=DockerSettings)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    pool: PoolSettings = Field(default_factory=PoolSettings)
    bounds: SandboxBounds = Field(
        default_factory=SandboxBounds,
        description="what a project's runtime profile may ask for: SUZUMIO_BOUNDS__MAX_CPUS, "
        "…__MAX_MEMORY_MB, …__MAX_DISK_MB, …__MAX_PIDS, …__MAX_WALL_CLOCK_SECONDS, "
        "…__IMAGES (a JSON list of patterns)",
    )
    default_backend: Backend = Field(
        default=Backend.PROCESS, description="for agents without a runtime profile"
    )
    backends: tuple[Backend, ...] = Field(
        default=(Backend.PROCESS,),
        description="the backends this orchestrator runs (JSON list): process, docker, "
        "kubernetes, pool",
    )
    work_dir: Path | None = Field(
        default=None, description="activation and session directories; <data_dir>/sandboxes"
    )
    broker_url: str = Field(
        default="http://127.0.0.1:8081", description="the tool-broker as sandboxes reach it"
    )
    broker_socket: Path | None = Field(
        default=None,
        description="the tool-broker's Unix socket on this host (its own SUZUMIO_BROKER_SOCKET): "
        "docker sandboxes of network 'none' get it mounted in, their only way out",
    )
    # OpenAI's own variables stand in for ours, as the runner takes them (and `suzumio up`
    # takes OPENAI_API_KEY for a configured model, turning its demo model off).
    model_base_url: str | None = Field(
        default=None,
        description="the model endpoint for agents whose model names no provider",
        validation_alias=AliasChoices("SUZUMIO_MODEL_BASE_URL", "OPENAI_BASE_URL"),
    )
    model_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("SUZUMIO_MODEL_API_KEY", "OPENAI_API_KEY")
    )
    allow_private_network: bool = Field(
        default=False, description="web.fetch in sandboxes may reach private addresses"
    )
    token_margin_seconds: int = Field(
        default=600, ge=60, description="a token outlives the wall-clock limit by this much"
    )
    workspace_retention_hours: float = Field(
        default=24.0, ge=0, description="ended activations' directories are removed after this"
    )
    max_artifact_bytes: int = Field(default=100 * 1024 * 1024, ge=1)
    max_artifacts: int = Field(default=200, ge=0)

    # Resolved once per (work_dir, data_dir), not on every call: every activation asks, and a
    # realpath is a system call per path component.
    _resolved: tuple[Path | None, Path, Path] | None = PrivateAttr(default=None)

    def default_images(self) -> frozenset[str]:
        """The images the backends run for profiles that name none: the operator's own."""
        return frozenset(i for i in (self.docker.image, self.kubernetes.image) if i)

    def sandboxes(self) -> Path:
        known = self._resolved
        if known is not None and known[0] == self.work_dir and known[1] == self.data_dir:
            return known[2]
        path = (self.work_dir or Path(self.data_dir) / "sandboxes").resolve()
        self._resolved = (self.work_dir, Path(self.data_dir), path)
        return path

    def activation_dir(self, activation_id: str) -> Path:
        """An activation's directory on this host (its input, workspace and exit record)."""
        return self.sandboxes() / "activations" / activation_id
