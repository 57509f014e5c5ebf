"""The tool-broker reads the fence of a call — the session's subject up to now, where a cancel
or a P0 is written — from a replica holding every write acknowledged, on a replicated log: a
follower behind answered without a cancel acknowledged a moment ago, and the call it fences
(a message to another session, an artifact, the output) went through. On one server, which
holds them all, it asks for no look-up of the log's end. Real NATS (one server: what is
checked is what the reads ask for)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from nats.aio.client import Client as NATS

from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.events import ActivationRequested
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.eventstore import AggregateStream, EventStore, Head
from suzumio.toolbroker.registry import ActivationRegistry


class Reads(EventStore):
    """Records what the registry's reads ask for."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.heads: list[bool] = []
        self.floors: list[int] = []

    async def head(self, aggregate: str, aggregate_id: str, *, latest: bool = False) -> Head:
        self.heads.append(latest)
        return await super().head(aggregate, aggregate_id, latest=latest)

    async def load(
        self,
        aggregate: str,
        aggregate_id: str,
        *,
        after: Head | None = None,
        min_last_seq: int = 0,
    ) -> AggregateStream:
        self.floors.append(min_last_seq)
        return await super().load(aggregate, aggregate_id, after=after, min_last_seq=min_last_seq)


@pytest.mark.parametrize("replicas", [1, 3])
async def test_the_fence_is_read_from_a_replica_holding_every_write(
    nc: NATS, topology: Topology, replicas: int
) -> None:
    registry = ActivationRegistry(
        nc, topology.model_copy(update={"replicas": replicas}), timedelta(hours=1)
    )
    await registry.start()
    try:
        store = Reads(nc, topology)
        session = new_id()
        request = ActivationRequested(activation_id=new_id(), agent_id=new_id(), signal_ids=())
        await store.append(session, [request], 0, EventMeta())

        assert await registry.fresh(store, session)
        # An activation older than the look-back, folded from its subjects.
        await registry.recall(store, new_id(), session)

        assert store.heads == [replicas > 1]
        assert len(store.floors) == 2
        assert all((floor > 0) is (replicas > 1) for floor in store.floors)
    finally:
        await registry.close()
