"""What the broker's routes share: connections, the registry, the operations, the metrics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.object_store import ObjectStore

from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.telemetry import meter
from suzumio.toolbroker.registry import ActivationRegistry
from suzumio.toolbroker.support import SupportOperations

if TYPE_CHECKING:
    from suzumio.toolbroker.access import Gate
    from suzumio.toolbroker.pending import PendingWaiter

_tool_calls = meter.create_counter(
    "suzumio_tool_calls", description="audited tool calls by tool and status"
)
_tool_duration = meter.create_histogram(
    "suzumio_tool_call_seconds", unit="s", description="tool call duration reported by runners"
)


class Metrics:
    def tool_call(self, tool: str, status: str, duration_ms: int | None = None) -> None:
        _tool_calls.add(1, {"tool": tool or "-", "status": status})
        if duration_ms is not None:
            _tool_duration.record(duration_ms / 1000, {"status": status})


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
