"""Everything the routes use, built once by the bootstrap."""

from __future__ import annotations

from dataclasses import dataclass, field

from nats.aio.client import Client as NATS
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from suzumio.contracts.subjects import Topology
from suzumio.contracts.values import Role
from suzumio.gateway.api.auth import CACHE_SECONDS, KeyCache
from suzumio.gateway.api.log_checks import LogChecks
from suzumio.gateway.livehub import LiveHub
from suzumio.gateway.settings import GatewaySettings
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.db.pool import Pool
from suzumio.platform.projections.positions import PositionWatcher
from suzumio.platform.secrets import SecretBox
from suzumio.platform.shares import Shares


@dataclass
class Gateway:
    settings: GatewaySettings
    nc: NATS
    pool: Pool
    topology: Topology
    commands: CommandClient
    positions: PositionWatcher
    secrets: SecretBox
    keys: KeyCache
    artifacts: ObjectStore
    artifacts_bucket: str
    services: KeyValue
    idempotency: KeyValue
    live: LiveHub
    # Streams open on this replica, by user: `SUZUMIO_STREAM_MAX_PER_USER` at most each.
    open_streams: Shares = field(default_factory=Shares)
    # (project, user) → role, as the log has it, while the projects' read model is frozen.
    roles: LogChecks[tuple[str, str], Role | None] = field(
        default_factory=lambda: LogChecks(CACHE_SECONDS)
    )
