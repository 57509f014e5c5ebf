"""The pool worker's NATS client: nats-py's, with the fix the services' connections have
(`suzumio.platform.bus.connection.Client`; the runner does not depend on the platform)."""

from __future__ import annotations

from typing import Any

from nats.aio.client import Client as NATS

from suzumio.contracts.nats_headers import parse_header_block


class Client(NATS):
    """nats-py's client, except that the PONG of a flush no longer waited for is dropped.

    nats-py (2.16) resolves each PONG's future without looking: the PONG of a flush that
    timed out (the worker's end, flushed before its ack) or was cancelled (a stop) raised
    `InvalidStateError` in the read loop, which stopped for good. The worker then looked
    connected and heard nothing — no dispatch, no cancel — until the pings found it stale.
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


async def connect(**options: Any) -> Client:
    """`nats.connect`, with this client."""
    nc = Client()
    await nc.connect(**options)
    return nc
