"""Reading the log from a given sequence with an ephemeral consumer that needs no acks."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from types import TracebackType
from typing import Self

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext

from suzumio.contracts.subjects import Topology

BATCH_BYTES = 32 * 1024 * 1024  # what a batch may hold in memory, about


class FetchSize:
    """How many events the next fetch asks for: up to the projector's batch, and about
    BATCH_BYTES of them by the size of the last ones. A batch is bounded by count at the
    server (nats-py's fetch sends no byte bound), and a thousand events of a megabyte each
    (a session's long messages) would be a gigabyte in memory at once. The first asks for a
    few only, the size of what comes not being known yet."""

    FIRST = 32

    def __init__(self, most: int) -> None:
        self._most = most
        self.next = min(most, self.FIRST)

    def took(self, msgs: Sequence[Msg]) -> None:
        if not msgs:
            return
        average = max(sum(len(m.data) for m in msgs) // len(msgs), 1)
        self.next = max(1, min(self._most, BATCH_BYTES // average))


class LogReader:
    """`async with LogReader(nc, topology, start_seq=1) as reader: await reader.fetch()`."""

    def __init__(self, nc: NATS, topology: Topology, *, start_seq: int, batch: int = 2_000) -> None:
        self._js = nc.jetstream()
        self._topology = topology
        self._start_seq = start_seq
        self._size = FetchSize(batch)
        self._sub: JetStreamContext.PullSubscription | None = None

    async def __aenter__(self) -> Self:
        config = ConsumerConfig(
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=max(self._start_seq, 1),
            inactive_threshold=60.0,
            mem_storage=True,
        )
        # The whole log, not just some aggregates: a consumer with several filter subjects
        # delivers in small, slow batches, and most projections read most events anyway.
        self._sub = await self._js.pull_subscribe(
            self._topology.events_filter(), stream=self._topology.events_stream, config=config
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    async def fetch(self, timeout: float = 1.0) -> list[Msg]:
        """The next messages in order; an empty list when none arrived within `timeout`."""
        assert self._sub is not None
        try:
            msgs: list[Msg] = await self._sub.fetch(self._size.next, timeout=timeout)
        except (TimeoutError, NatsTimeoutError):
            return []
        self._size.took(msgs)
        return msgs
