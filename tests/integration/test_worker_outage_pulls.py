"""A pool worker cut off from NATS asks the queue for nothing until it is back: nats-py
buffers a pull request made meanwhile and sends it at the reconnect with every other one
asked (one a second), and the queue then handed the worker that many dispatches at once,
more than its slots, held unstarted past their ack wait. Real NATS, through a relay whose
connections are cut (only the worker's outage); an in-process worker."""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from pathlib import Path

from nats.aio.client import Client as NATS
from nats.js.errors import NotFoundError

from suzumio.contracts.subjects import Topology
from suzumio.runner.worker import Worker, WorkerConfig
from tests.integration.test_pool_backend import CuttableLink
from tests.support import eventually

OUTAGE_SECONDS = 4.0


async def _pulls_waiting(nc: NATS, topology: Topology) -> int:
    try:
        info = await nc.jetstream().consumer_info(
            topology.activations_stream, topology.pool_consumer("default")
        )
    except NotFoundError:  # not made yet: the worker makes it as it starts
        return 0
    return int(info.num_waiting or 0)


async def test_a_worker_back_from_an_outage_asks_for_one_dispatch_not_one_a_second(
    nats_url: str, nc: NATS, topology: Topology, tmp_path: Path
) -> None:
    parsed = urllib.parse.urlsplit(nats_url)
    link = CuttableLink((parsed.hostname or "127.0.0.1", parsed.port or 4222))
    port = await link.start()
    relayed = parsed._replace(netloc=f"{parsed.netloc.rsplit('@', 1)[0]}@127.0.0.1:{port}")
    worker = Worker(
        WorkerConfig(
            nats_url=urllib.parse.urlunsplit(relayed),
            namespace=topology.namespace,
            workdir=tmp_path,
            worker_id="wa",
            drain_seconds=1,
            warm_runners=False,
        )
    )

    async def connected() -> bool:
        return worker.nc.is_connected

    stop = asyncio.Event()
    serving = asyncio.create_task(worker.run(stop))
    try:
        await eventually(lambda: _pulls_waiting(nc, topology), lambda n: n >= 1, timeout=30)
        link.cut()
        await asyncio.sleep(OUTAGE_SECONDS)  # its pull loop goes round once a second
        link.down = False
        await eventually(connected, lambda up: up, timeout=15)
        # Each request the worker made lives a second past its arrival: the most seen at
        # once in the seconds after the reconnect.
        most, until = 0, time.monotonic() + 1.5
        while time.monotonic() < until:
            most = max(most, await _pulls_waiting(nc, topology))
            await asyncio.sleep(0.02)
        assert most <= 1, f"{most} pull requests at once after the outage"
    finally:
        stop.set()
        await asyncio.wait_for(serving, 30)
        await link.close()
