"""`PullWorker` rides out a NATS outage instead of `run` raising (which exits the service's
process, e.g. the session service's resume-signals consumer): a fetch answered 503 (the
consumer unavailable: its leader moving in a cluster, JetStream recovering, the consumer lost),
an ack that NATS cannot take while reconnecting, a server stopped and started again. NATS
servers of their own, stopped and started under a running worker."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from suzumio.contracts.events import ProjectCreated
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus import connection
from suzumio.platform.bus.consumer import ConsumerSpec, PullWorker, event_parker
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.bus.jsapi import ensure_streams
from suzumio.platform.embedded import start_nats
from suzumio.platform.embedded.process import free_port
from tests.support import eventually


def holds(aggregate_id: str) -> Callable[[list[str]], bool]:
    return lambda handled: aggregate_id in handled


async def append_when_up(store: EventStore, aggregate_id: str) -> None:
    for _ in range(100):
        with contextlib.suppress(Exception):
            await store.append(aggregate_id, [ProjectCreated(name=aggregate_id, owner_id="u")], 0)
            return
        await asyncio.sleep(0.2)
    raise AssertionError("NATS never took the event")


def review_spec(topology: Topology) -> ConsumerSpec:
    return ConsumerSpec(
        stream=topology.events_stream,
        durable="review-worker",
        filter_subjects=(topology.events_filter("project"),),
        ack_wait=3.0,
        backoff=(0.05,),
    )


async def test_a_fetch_answered_503_is_waited_out(tmp_path: Path, topology: Topology) -> None:
    """The consumer not answering (503 No Responders: deleted here, as it is unavailable while
    its leader moves) made `fetch` raise out of `run`. Now the worker backs off, makes the
    consumer again and goes on."""
    server = start_nats(tmp_path / "nats", port=free_port(), monitoring=False)
    stop = asyncio.Event()
    task: asyncio.Task[None] | None = None
    nc = await connection.connect(server.url, "pullworker-review")
    try:
        await ensure_streams(nc, topology.streams())
        store = EventStore(nc, topology)
        done: list[str] = []

        async def handle(msg: Msg) -> None:
            done.append(msg.subject.rsplit(".", 1)[-1])

        spec = review_spec(topology)
        worker = PullWorker(nc, spec, handle, event_parker(store, "review-worker"))
        task = asyncio.create_task(worker.run(stop))
        await append_when_up(store, first := new_id())
        await eventually(lambda: asyncio.sleep(0, done), holds(first), what="first")

        await nc.jetstream().delete_consumer(spec.stream, spec.durable)
        await asyncio.sleep(2)
        assert not task.done(), task.exception() if task.done() else None
        await append_when_up(store, later := new_id())
        await eventually(lambda: asyncio.sleep(0, done), holds(later), what="after the 503s")
        assert not task.done()
    finally:
        stop.set()
        try:
            if task is not None:
                await asyncio.wait_for(task, 10)  # stopped when told to, without an error
        finally:
            await nc.close()
            server.stop()


async def test_an_ack_nats_cannot_take_is_left_to_redelivery(
    tmp_path: Path, topology: Topology
) -> None:
    """A client that cannot buffer what it sends while it reconnects (as a full outbound
    buffer does): the ack of a message handled while NATS is away raised out of `run`. Now it
    is logged; the message comes back after the restart and is handled again."""
    port = free_port()
    server = start_nats(tmp_path / "nats", port=port, monitoring=False)
    stop = asyncio.Event()
    task: asyncio.Task[None] | None = None
    nc = await nats.connect(
        server.url,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.2,
        pending_size=0,  # nothing buffered while disconnected
    )
    try:
        await ensure_streams(nc, topology.streams())
        store = EventStore(nc, topology)
        handled: list[str] = []
        in_handler = asyncio.Event()
        release = asyncio.Event()

        async def handle(msg: Msg) -> None:
            in_handler.set()
            await release.wait()
            handled.append(msg.subject.rsplit(".", 1)[-1])

        worker = PullWorker(nc, review_spec(topology), handle, event_parker(store, "w"))
        task = asyncio.create_task(worker.run(stop))
        await append_when_up(store, slow := new_id())
        await asyncio.wait_for(in_handler.wait(), 10)
        server.stop()
        await asyncio.sleep(0.5)
        release.set()  # handled while NATS is away: its ack cannot be sent
        await asyncio.sleep(2)
        assert not task.done(), task.exception() if task.done() else None
        server = start_nats(tmp_path / "nats", port=port, monitoring=False)
        await eventually(
            lambda: asyncio.sleep(0, handled),
            lambda h: h.count(slow) >= 2,  # redelivered (its ack lost) and handled again
            timeout=30,
            what="the redelivery",
        )
        assert not task.done()
    finally:
        stop.set()
        try:
            if task is not None:
                await asyncio.wait_for(task, 10)
        finally:
            await nc.close()
            server.stop()


async def test_a_pull_worker_rides_out_nats_restarts(tmp_path: Path, topology: Topology) -> None:
    port = free_port()
    server = start_nats(tmp_path / "nats", port=port, monitoring=False)
    nc: NATS | None = None
    stop = asyncio.Event()
    task: asyncio.Task[None] | None = None
    try:
        nc = await connection.connect(server.url, "pullworker-review")
        await ensure_streams(nc, topology.streams())
        store = EventStore(nc, topology)
        done: list[str] = []
        in_handler = asyncio.Event()
        release = asyncio.Event()
        slow = new_id()

        async def handle(msg: Msg) -> None:
            aggregate_id = msg.subject.rsplit(".", 1)[-1]
            if aggregate_id == slow and not release.is_set():
                in_handler.set()
                await release.wait()  # finished (and acked) while NATS is away
            done.append(aggregate_id)

        worker = PullWorker(nc, review_spec(topology), handle, event_parker(store, "w"))
        task = asyncio.create_task(worker.run(stop))
        await append_when_up(store, first := new_id())
        await eventually(lambda: asyncio.sleep(0, done), lambda d: first in d, what="first")

        await append_when_up(store, slow)
        await asyncio.wait_for(in_handler.wait(), 10)
        for round_ in range(3):
            server.stop()
            await asyncio.sleep(1.5)  # fetches (and the ack below) meet NATS away
            release.set()
            await asyncio.sleep(1.0)
            assert not task.done(), (round_, task.exception() if task.done() else None)
            server = start_nats(tmp_path / "nats", port=port, monitoring=False)
            await append_when_up(store, later := new_id())
            await eventually(
                lambda: asyncio.sleep(0, done),
                holds(later),
                timeout=30,
                what=f"an event after restart {round_}",
            )
            assert not task.done()
        assert slow in done  # redelivered if its ack was lost; handled in any case
    finally:
        stop.set()
        if task is not None:
            await asyncio.wait_for(task, 10)  # stopped when told to, without an error
        if nc is not None:
            await nc.close()
        server.stop()
