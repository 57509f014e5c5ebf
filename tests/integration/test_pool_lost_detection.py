"""A running dispatch whose heartbeats stopped is declared lost only if nothing is heard of it
while the workers are asked: a worker back from an outage flushes the heartbeats (or the
end) it buffered before its subscription to the question is back, and a healthy run killed
for the silence was done again — and an end's outputs were never recorded. Real NATS; the
workers' answers to the question are the test's."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from suzumio.contracts.ids import new_id
from suzumio.contracts.runner import PoolStatus, PoolStatusKind, PoolWorkerInfo
from suzumio.contracts.subjects import Topology
from suzumio.orchestrator.backends.pool import PoolBackend, PoolSettings, _Tracker

TIMEOUT = 2.0


@pytest_asyncio.fixture
async def backend(nc: NATS, topology: Topology) -> AsyncIterator[PoolBackend]:
    created = PoolBackend(nc, topology, PoolSettings(heartbeat_timeout_seconds=TIMEOUT))
    yield created
    await created.close()


def silent(activation_id: str) -> _Tracker:
    """A dispatch started on `wa`, heard of last well past the heartbeat timeout."""
    tracker = _Tracker(f"{activation_id}.1", started=True, worker_id="wa")
    tracker.last_seen = time.monotonic() - 10 * TIMEOUT
    return tracker


def word(activation_id: str, kind: PoolStatusKind) -> PoolStatus:
    return PoolStatus(
        kind=kind,
        dispatch_id=f"{activation_id}.1",
        activation_id=activation_id,
        attempt=1,
        worker_id="wa",
        pool="default",
        at=datetime.now(UTC),
        reason="exited" if kind == "exited" else "",
        exit_code=0 if kind == "exited" else None,
    )


@pytest.mark.parametrize("heard", ["heartbeat", "exited", None])
async def test_a_dispatch_heard_of_while_the_workers_are_asked_is_not_lost(
    backend: PoolBackend, heard: PoolStatusKind | None
) -> None:
    activation_id = new_id()
    tracker = silent(activation_id)
    backend._connected_since = time.monotonic() - 10 * TIMEOUT  # noqa: SLF001 - heard all along

    async def ask(dispatch_id: str | None = None) -> list[PoolWorkerInfo]:
        if heard is not None:  # the worker's buffered word arrives; its answer does not
            assert tracker.update(word(activation_id, heard))
        return []

    backend._ask_workers = ask  # type: ignore[method-assign]  # noqa: SLF001
    claimed: Any = await backend._claimed(tracker)  # noqa: SLF001

    assert claimed is (heard is not None)  # silent still, and unclaimed: lost


async def test_a_queued_dispatch_no_worker_claims_is_still_lost(backend: PoolBackend) -> None:
    """The queued path looks at a dispatch just after it noted the look (its silence is then
    short): what makes it claimed is a word heard while the workers were asked, not that."""
    tracker = _Tracker(f"{new_id()}.1", started=False)
    tracker.last_seen = time.monotonic()

    async def ask(dispatch_id: str | None = None) -> list[PoolWorkerInfo]:
        return []

    backend._ask_workers = ask  # type: ignore[method-assign]  # noqa: SLF001
    assert not await backend._claimed(tracker)  # noqa: SLF001
