"""Connecting to NATS the same way everywhere: named, reconnecting forever, errors logged."""

from __future__ import annotations

import nats
from nats.aio.client import Client as NATS

from suzumio.platform.logging import get_logger

log = get_logger(__name__)


async def connect(url: str, name: str, *, connect_timeout: float = 5.0) -> NATS:
    """A client that keeps reconnecting (a NATS restart is an outage, not a crash)."""

    async def on_error(exc: Exception) -> None:
        log.warning("nats.error", error=str(exc) or type(exc).__name__)

    async def on_disconnected() -> None:
        log.warning("nats.disconnected")

    async def on_reconnected() -> None:
        log.info("nats.reconnected")

    return await nats.connect(
        servers=[url],
        name=name,
        connect_timeout=connect_timeout,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        allow_reconnect=True,
        error_cb=on_error,
        disconnected_cb=on_disconnected,
        reconnected_cb=on_reconnected,
        pending_size=64 * 1024 * 1024,
    )
