"""A pool worker beginning to stop declines what it fetched meanwhile — but not a redelivered
copy of a dispatch it runs: handed back `busy`, the orchestrator took that word, from the
run's own worker, for the run's end, and cancelled the healthy run. Real NATS (the worker's
own consumer, its message, the statuses); the worker's loop is not running."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig

from suzumio.contracts.subjects import Topology
from suzumio.orchestrator.backends.pool import PoolBackend, PoolSettings
from suzumio.runner.worker import Worker, WorkerConfig
from tests.integration.test_pool_backend import make_plan


async def test_a_stopping_worker_leaves_a_copy_of_its_own_run_alone(
    nc: NATS, topology: Topology, tmp_path: Path
) -> None:
    dispatch = PoolBackend(nc, topology, PoolSettings())._dispatch(  # noqa: SLF001
        make_plan("http://127.0.0.1:9", tmp_path)
    )
    js = nc.jetstream()
    subject = topology.worker_activation_subject("default", "wa")
    durable = topology.worker_consumer("default", "wa")
    config = ConsumerConfig(
        durable_name=durable, filter_subject=subject, ack_policy=AckPolicy.EXPLICIT, ack_wait=30
    )
    await js.add_consumer(topology.activations_stream, config)
    await js.publish(subject, dispatch.model_dump_json().encode())
    psub = await js.pull_subscribe_bind(durable, topology.activations_stream)
    [copy] = await psub.fetch(1)
    said: list[Msg] = []

    async def hear(msg: Msg) -> None:
        said.append(msg)

    await nc.subscribe(topology.pool_status_subject("*"), cb=hear)

    worker = Worker(WorkerConfig(namespace=topology.namespace, workdir=tmp_path, worker_id="wa"))
    worker._nc = nc  # noqa: SLF001
    running: Any = object()
    worker._runs[dispatch.dispatch_id] = running  # noqa: SLF001 - it runs here
    stopping = asyncio.Event()
    stopping.set()
    await worker._take([copy], stopping, own=True)  # noqa: SLF001

    await nc.flush()
    await asyncio.sleep(0.3)
    assert said == []  # no `busy` for the run's own dispatch
    info = await js.consumer_info(topology.activations_stream, durable)
    assert info.num_ack_pending == 1  # left to the run, which acks it at its end
