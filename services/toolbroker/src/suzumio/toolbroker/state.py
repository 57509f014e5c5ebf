"""What the broker's routes share: connections, the registry, the operations, the metrics."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.object_store import ObjectStore

from suzumio.contracts.subjects import Topology
from suzumio.contracts.toolpacks import ToolpackManifest
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.telemetry import SECONDS_BUCKETS, meter
from suzumio.toolbroker.checkpoints import LatestCheckpoints
from suzumio.toolbroker.registry import ActivationRegistry
from suzumio.toolbroker.settings import LIVE_BUDGET, LOG_BUDGET, MAX_TOOL_CALLS
from suzumio.toolbroker.support import SupportOperations

if TYPE_CHECKING:
    from suzumio.toolbroker.access import Gate
    from suzumio.toolbroker.credentials import CredentialDesk
    from suzumio.toolbroker.model_relay import ModelRelay
    from suzumio.toolbroker.pending import PendingWaiter

_tool_calls = meter.create_counter(
    "suzumio_tool_calls", description="audited tool calls by tool and status"
)
_tool_duration = meter.create_histogram(
    "suzumio_tool_call_seconds",
    unit="s",
    description="tool call duration reported by runners",
    explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
)

# The runner's own tools (`suzumio.runner.tools.registry.BUILTIN_TOOLS`), which every
# activation may be given.
BUILTIN_TOOLS = frozenset(
    {
        "activation.complete",
        "ask_user",
        "checkpoint",
        "file.patch",
        "file.read",
        "file.search",
        "file.write",
        "message.send",
        "shell.exec",
        "signal.record",
        "web.fetch",
    }
)
OTHER_TOOL = "other"
UNKNOWN_TOOL = "-"  # a finish whose start this replica did not see


@dataclass
class Metrics:
    """The broker's metrics. A tool's name comes from the sandbox, which may send anything: it
    labels a series only if it is one of the runner's tools or of a toolpack installed here
    that the activation's token enables; any other is `other` (one series, not one a name)."""

    toolpacks: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, manifests: Mapping[str, ToolpackManifest]) -> Metrics:
        return cls({n: frozenset(t.name for t in m.tools) for n, m in manifests.items()})

    def tool_label(self, tool: str, toolpacks: Iterable[str]) -> str:
        if tool in BUILTIN_TOOLS:
            return tool
        if any(tool in self.toolpacks.get(pack, ()) for pack in toolpacks):
            return tool
        return OTHER_TOOL

    def tool_call(self, tool: str, status: str, duration_ms: int | None = None) -> None:
        """`tool`: a label (`tool_label`), never a name as the sandbox sent it."""
        _tool_calls.add(1, {"tool": tool or UNKNOWN_TOOL, "status": status})
        if duration_ms is not None:
            _tool_duration.record(
                duration_ms / 1000, {"tool": tool or UNKNOWN_TOOL, "status": status}
            )


@dataclass(frozen=True)
class Artifacts:
    """The artifacts' object store, and what one activation may send back from its
    `/workspace/out` through the broker (sandboxes that share no disk: kubernetes)."""

    store: ObjectStore
    bucket: str
    max_files: int
    max_bytes: int


@dataclass
class Broker:
    nc: NATS
    js: JetStreamContext
    topology: Topology
    store: EventStore
    commands: CommandClient
    registry: ActivationRegistry
    operations: SupportOperations
    metrics: Metrics
    gate: Gate
    waiter: PendingWaiter
    artifacts: Artifacts
    # Opens provider keys for `POST /runner/credentials`; none: that route answers 404.
    credentials: CredentialDesk | None = None
    # Model calls of sandboxes without any network (`model_relay`); none: its routes are 404.
    relay: ModelRelay | None = None
    # Bytes of live output one activation may publish on a replica (`SUZUMIO_LIVE_BYTES_PER_
    # ACTIVATION`): LIVE is held in the NATS server's memory.
    live_budget: int = LIVE_BUDGET
    max_tool_calls: int = MAX_TOOL_CALLS  # started by one activation
    # Bytes one activation may have written to the log by its other calls, on a replica
    # (`SUZUMIO_LOG_BYTES_PER_ACTIVATION`).
    log_budget: int = LOG_BUDGET
    checkpoints: LatestCheckpoints = field(init=False)

    def __post_init__(self) -> None:
        self.checkpoints = LatestCheckpoints(self.nc, self.topology, self.store)
