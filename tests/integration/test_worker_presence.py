"""A pool worker's presence goes on whatever its housekeeping meets (real NATS, the worker in
this process): a warm session's workspace that cannot be removed at its idle TTL must not
end the presence beats, or the orchestrator would count the worker as gone and its running
activations as lost."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from suzumio.contracts.subjects import Topology
from suzumio.runner.worker import Worker, WorkerConfig
from tests.support import eventually


class Stubborn(Worker):
    """A worker whose workspaces cannot be removed (as one whose removal meets an error the
    worker did not foresee)."""

    discards = 0

    def _discard(self, path: Path) -> None:
        type(self).discards += 1
        raise RuntimeError(f"{path} cannot go")


async def test_presence_goes_on_though_a_warm_workspace_cannot_be_removed(
    nats_url: str, nc: NATS, topology: Topology, tmp_path: Path
) -> None:
    config = WorkerConfig(
        nats_url=nats_url,
        namespace=topology.namespace,
        workdir=tmp_path,
        worker_id="stubborn",
        heartbeat_seconds=0.1,
        idle_ttl_seconds=0.05,
        warm_runners=False,
    )
    worker = Stubborn(config)
    taken = worker.warm.take("session-a")
    assert taken is not None
    worker.warm.give_back("session-a")  # idle now: it expires at the next beat but one
    beats: list[Msg] = []

    async def beat(msg: Msg) -> None:
        beats.append(msg)

    sub = await nc.subscribe(topology.pool_worker_subject("stubborn"), cb=beat)
    stop = asyncio.Event()
    serving = asyncio.create_task(worker.run(stop))
    try:
        await eventually(lambda: asyncio.sleep(0, Stubborn.discards), bool, what="the removal")
        seen = len(beats)
        await eventually(
            lambda: asyncio.sleep(0, len(beats) - seen),
            lambda more: more >= 5,
            what="beats after the removal failed",
        )
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(serving, 30)
        await sub.unsubscribe()
