"""An installation's id (real NATS): made once, by whichever service asks first, and the same
for every later ask — replicas starting together included; another namespace has its own."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NATS

from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.installation import installation_id


async def test_every_ask_gets_the_one_id_made_first(nc: NATS, topology: Topology) -> None:
    js = nc.jetstream()
    together = await asyncio.gather(*(installation_id(js, topology) for _ in range(5)))
    assert len(set(together)) == 1
    assert await installation_id(js, topology) == together[0]
    other = Topology(namespace=f"{topology.namespace}x")
    assert await installation_id(js, other) != together[0]
