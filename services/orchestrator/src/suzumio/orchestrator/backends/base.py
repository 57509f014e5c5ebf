"""One interface for every sandbox backend (DESIGN.md §8): launch, watch, cancel, cleanup,
list_live (for reconciliation after a restart) and health.

The orchestrator builds a `LaunchPlan` — the runner input (with the token), the sandbox's
environment (provider keys: secrets, redacted everywhere else), the runtime profile, the
activation's directory on this host, the mounts and the labels — and a backend turns it into a
running sandbox. A `Handle` names that sandbox in a JSON-safe way, so it can be found again
after an orchestrator restart; `watch` returns its `Exit`.

Layout of an activation's directory (`host_dir`), for backends that use the host's disk:
`input.json` (the input, read-only to the sandbox), `workspace/` (the sandbox's `/workspace`;
what it leaves in `workspace/out/` becomes artifacts of the session). The session's own
directory (`session_dir`) is the sandbox's `/workspace/session`, kept across activations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from suzumio.contracts.runner import FileRef, RunnerActivationInput
from suzumio.contracts.values import RuntimeProfileSpec

LABEL_PREFIX = "io.suzumio"
INPUT_PATH = "/activation/input.json"  # inside the sandbox
WORKSPACE = "/workspace"
# Network `none`: the broker URL a sandbox is given only names the broker (its requests go
# through the socket bound in).
OFFLINE_BROKER_URL = "http://suzumio-broker"
RESERVED_TARGETS = ("/activation", WORKSPACE, "/proc", "/sys", "/dev", "/etc", "/usr", "/bin")


@dataclass(frozen=True)
class MountPlan:
    host_path: Path
    target: str  # absolute, inside the sandbox, not under a reserved target
    writable: bool = False


@dataclass(frozen=True)
class LaunchPlan:
    activation_id: str
    session_id: str
    project_id: str
    agent_id: str
    attempt: int
    input: RunnerActivationInput
    """With `workspace` = /workspace and the broker URL as the sandbox reaches it; a backend
    that runs the runner elsewhere (the process backend) rewrites the paths."""
    profile: RuntimeProfileSpec
    env: dict[str, str]
    """The sandbox's environment: ids, the model endpoints and keys. Values of `secret_keys`
    must never appear in a log, an event or a rendered manifest."""
    secret_keys: frozenset[str]
    host_dir: Path
    session_dir: Path
    mounts: tuple[MountPlan, ...] = ()
    deadline: datetime | None = None
    labels: dict[str, str] = field(default_factory=dict)
    inputs: tuple[FileRef, ...] = ()
    """For a backend whose sandboxes run elsewhere (pool): the files to copy into
    `/workspace/in` there, and the limits of what to bring back from `/workspace/out`."""
    max_output_files: int = 0
    max_output_bytes: int = 0
    broker_socket: Path | None = None
    """Network `none` (docker, and process with bubblewrap): the tool-broker's Unix socket on
    this host, which the sandbox gets bound in — its only way out, to the broker and its model
    relay."""
    origins: tuple[int, ...] = ()
    """Where the log stored its batch's signals (stream sequences): the requests whose trace
    the launch continues (`suzumio.orchestrator.tracing`)."""

    def redacted_env(self) -> dict[str, str]:
        return {k: ("***" if k in self.secret_keys else v) for k, v in self.env.items()}


@dataclass(frozen=True)
class Handle:
    activation_id: str
    backend: str
    sandbox_id: str  # a pid, a container id, a Job name, a dispatch id
    data: dict[str, Any] = field(default_factory=dict)  # JSON-safe, backend-specific
    # listed with its end already known and nothing left to stop or remove (a pool worker's
    # recent exit): `watch` returns that end; no orphan to clean up
    ended: bool = False
    # listed with its sandbox no longer running but still there (an exited container, a
    # finished Job): nothing to stop — stopping a Job deletes it, whatever the cleanup policy
    # says — only what is left of it, for `cleanup` to keep or remove
    finished: bool = False


@dataclass(frozen=True)
class Exit:
    code: int | None  # the runner's exit code; None when the sandbox was lost or killed
    reason: Literal["exited", "killed", "oom", "lost", "timeout", "cancelled"] = "exited"
    detail: str = ""
    outputs: tuple[FileRef, ...] = ()  # stored from `/workspace/out` where the sandbox ran
    # Whether another attempt could do better, when the backend knows (a pod whose image
    # name is invalid never will); None leaves it to the engine's rules.
    retryable: bool | None = None
    # The sandbox vanished and its exit code with it (a Job deleted): if the activation's
    # output is on record, its runner had finished and ends as it does after that output.
    gone: bool = False


@dataclass(frozen=True)
class Health:
    ok: bool
    detail: dict[str, Any] = field(default_factory=dict)


class LaunchError(Exception):
    """The sandbox could not be started (bad image, engine down, …): a failed attempt."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


CleanupPolicy = Literal["always", "on_success", "never"]


class Backend(Protocol):
    name: str

    async def launch(self, plan: LaunchPlan) -> Handle:
        """Start the sandbox; raise `LaunchError` if it cannot be started."""
        ...

    async def watch(self, handle: Handle) -> Exit:
        """Wait until the sandbox ends (also one found by `list_live` after a restart)."""
        ...

    async def cancel(self, handle: Handle) -> None:
        """Stop it now (idempotent; a sandbox that is gone already is fine)."""
        ...

    async def cleanup(self, handle: Handle, succeeded: bool) -> None:
        """Remove what is left of it, as the backend's cleanup policy says."""
        ...

    async def list_live(self) -> list[Handle]:
        """Every sandbox of this platform the backend still has (running or not removed)."""
        ...

    async def health(self) -> Health: ...

    async def release(self) -> None:
        """This replica stopped leading: forget what it kept to watch its sandboxes (they
        live on; the next leader finds them with `list_live`). It may lead again later."""
        ...

    async def close(self) -> None: ...


INSTALLATION_LABEL = f"{LABEL_PREFIX}.installation"


def labels_for(plan: LaunchPlan, namespace: str, installation: str | None = None) -> dict[str, str]:
    """What marks a sandbox as this platform's: `installation` (the id made once per
    installation, `suzumio.platform.bus.installation`) tells apart installations sharing a
    Docker engine or Kubernetes namespace that kept the same (default) namespace."""
    labels = {
        f"{LABEL_PREFIX}.managed": "true",
        f"{LABEL_PREFIX}.namespace": namespace or "-",
        f"{LABEL_PREFIX}.project": plan.project_id,
        f"{LABEL_PREFIX}.agent": plan.agent_id,
        f"{LABEL_PREFIX}.session": plan.session_id,
        f"{LABEL_PREFIX}.activation": plan.activation_id,
        f"{LABEL_PREFIX}.attempt": str(plan.attempt),
    }
    if installation is not None:
        labels[INSTALLATION_LABEL] = installation
    return labels


def of_another_installation(found: str | None, installation: str | None) -> bool:
    """Whether a sandbox labelled `found` (None: unlabelled, from a release before the label)
    belongs to another installation than `installation` (None: any is this one's)."""
    return installation is not None and found is not None and found != installation
