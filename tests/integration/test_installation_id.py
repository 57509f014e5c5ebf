"""An installation's id (real NATS): made once, by whichever service asks first, and the same
for every later ask — replicas starting together included; another namespace has its own."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from nats.aio.client import Client as NATS
from nats.js.errors import NoStreamResponseError
from nats.js.kv import KeyValue

from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.installation import installation_id


async def test_every_ask_gets_the_one_id_made_first(nc: NATS, topology: Topology) -> None:
    js = nc.jetstream()
    together = await asyncio.gather(*(installation_id(js, topology) for _ in range(5)))
    assert len(set(together)) == 1
    assert await installation_id(js, topology) == together[0]
    other = Topology(namespace=f"{topology.namespace}x")
    assert await installation_id(js, other) != together[0]


async def test_a_bucket_not_ready_yet_is_asked_again(
    nc: NATS, topology: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bucket just made on a cluster answers nothing until its replicas elected a leader:
    an orchestrator started with its cluster's first moments exited at once (seen in the
    cluster test). Its first two creates meet no stream here; the third makes the id."""
    real = KeyValue.create
    refused: list[str] = []

    async def create(self: KeyValue, key: str, value: bytes, **kw: Any) -> int:
        if len(refused) < 2:
            refused.append(key)
            raise NoStreamResponseError
        return await real(self, key, value, **kw)

    monkeypatch.setattr(KeyValue, "create", create)
    made = await installation_id(nc.jetstream(), topology)
    assert len(refused) == 2
    monkeypatch.undo()
    assert await installation_id(nc.jetstream(), topology) == made
