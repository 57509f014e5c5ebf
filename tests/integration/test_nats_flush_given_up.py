"""A flush given up (its task cancelled, or timed out) must not leave the connection deaf.

nats-py 2.16 resolved the PONG of such a flush on its cancelled future: `InvalidStateError`
in the read loop, which then stopped, and the connection delivered nothing more while it
still read as connected. It took down a pool backend whose cancel broadcast was cut short:
the worker's word on the run's end never reached it. Both the services' connection and the
pool worker's have the fix.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from nats.aio.client import Client as NATS

from suzumio.contracts.nats_servers import nats_servers
from suzumio.platform.bus import connection
from suzumio.runner import nats_client


async def _services(url: str) -> NATS:
    return await connection.connect(url, "suzumio-test-flush")


async def _worker(url: str) -> NATS:
    servers, credentials = nats_servers(url)
    return await nats_client.connect(servers=servers, name="suzumio-test-worker", **credentials)


@pytest.mark.parametrize("connect", [_services, _worker], ids=["services", "worker"])
async def test_a_cancelled_flush_leaves_the_connection_hearing(
    nats_url: str, connect: Callable[[str], Awaitable[NATS]]
) -> None:
    nc = await connect(nats_url)
    other = await connection.connect(nats_url, "suzumio-test-sender")
    try:
        heard: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_msg(msg: object) -> None:
            heard.put_nowait(msg.data)  # type: ignore[attr-defined]

        await nc.subscribe("flush.given.up", cb=on_msg)
        await nc.flush()
        flushing = asyncio.create_task(nc.flush(timeout=5))
        await asyncio.sleep(0)  # it sent its PING and waits for the PONG
        assert not flushing.done()
        flushing.cancel()
        await asyncio.gather(flushing, return_exceptions=True)
        await asyncio.sleep(0.2)  # the PONG of the cancelled flush came back meanwhile

        await other.publish("flush.given.up", b"still heard")
        await other.flush()
        assert await asyncio.wait_for(heard.get(), 5) == b"still heard"
        await nc.flush(timeout=5)  # the PONGs stay paired with their flushes
        assert nc.is_connected
    finally:
        await other.close()
        await nc.close()
