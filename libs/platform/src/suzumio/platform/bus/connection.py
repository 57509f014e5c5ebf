"""Connecting to NATS the same way everywhere: named, reconnecting forever, errors logged."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from nats import errors as nats_errors
from nats.aio.client import Client as NATS

from suzumio.contracts.nats_headers import parse_header_block
from suzumio.contracts.nats_servers import nats_servers
from suzumio.platform.logging import get_logger

log = get_logger(__name__)


class Client(NATS):
    """nats-py's client, except that the PONG of a flush no longer waited for is dropped.

    nats-py (2.16) resolves each PONG's future without looking. A flush that timed out, or
    whose task was cancelled (a cancel's broadcast cut short by its caller's cancel), left
    its future cancelled in the queue; the PONG for it raised `InvalidStateError` in the read
    loop, which stopped for good. The connection then looked connected and read nothing — no
    message, no reply, no heartbeat — until the pings found it stale, minutes later.
    The runner's pool worker connects with the same fix (`suzumio.runner.nats_client`).
    """

    # The header blocks parsed in a fraction of the time (`suzumio.contracts.nats_headers`).
    _parse_header_lines = staticmethod(parse_header_block)

    async def _process_pong(self) -> None:
        if self._pongs and self._pongs[0].done():  # its flush gave up: this PONG is its own
            self._pongs.pop(0)
            self._pongs_received += 1
            self._pings_outstanding = 0
            return
        await super()._process_pong()


class NatsUnreachableError(ConnectionError):
    """The first connect did not succeed within the time a short-lived command allows."""


async def connect(
    url: str,
    name: str,
    *,
    connect_timeout: float = 5.0,
    first_connect_within: float | None = None,
) -> NATS:
    """A client that keeps reconnecting (a NATS restart is an outage, not a crash).

    A service waits for NATS at start as long as it takes (None); a command a person runs
    gives `first_connect_within` seconds and gets `NatsUnreachableError`, not a silent hang.
    """
    nc = Client()
    connected = False

    def quiet() -> bool:
        # A bounded first connect is reported once by the caller, in its own words.
        return first_connect_within is not None and not connected

    async def on_error(exc: Exception) -> None:
        if not quiet():
            log.warning("nats.error", error=str(exc) or type(exc).__name__)

    async def on_disconnected() -> None:
        if not quiet():
            log.warning("nats.disconnected")

    async def on_reconnected() -> None:
        log.info("nats.reconnected")

    options: dict[str, Any] = {  # nats.connect's own **options, typed as loosely as it does
        "connect_timeout": connect_timeout,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.5,
        "allow_reconnect": True,
        "error_cb": on_error,
        "disconnected_cb": on_disconnected,
        "reconnected_cb": on_reconnected,
        "pending_size": 64 * 1024 * 1024,
    }
    servers, credentials = nats_servers(url)
    options.update(credentials)
    attempt = nc.connect(servers=servers, name=name, **options)
    if first_connect_within is None:
        await attempt
        return nc
    try:
        await asyncio.wait_for(attempt, first_connect_within)
        connected = True
    except (TimeoutError, OSError, nats_errors.Error) as exc:
        with contextlib.suppress(Exception):
            await nc.close()
        raise NatsUnreachableError(
            f"NATS at {url} did not answer within {first_connect_within:g} s"
        ) from exc
    return nc
