"""The pull-consumer helper on real JetStream: ack after success, bounded redelivery,
parking of poison messages, heartbeats for slow handlers."""

from __future__ import annotations

import asyncio
from collections import Counter

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from suzumio.contracts.events import MessageParked, ProjectCreated
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.consumer import ConsumerSpec, PullWorker, event_parker
from suzumio.platform.bus.eventstore import EventStore
from tests.support import eventually


def spec(topology: Topology, **overrides: object) -> ConsumerSpec:
    base: dict[str, object] = {
        "stream": topology.events_stream,
        "durable": "worker",
        "filter_subjects": (topology.events_filter("project"),),
        "max_deliver": 3,
        "ack_wait": 2.0,
        "backoff": (0.05, 0.05),
        "batch": 16,
    }
    base.update(overrides)
    return ConsumerSpec(**base)  # type: ignore[arg-type]


async def run_worker(worker: PullWorker) -> tuple[asyncio.Event, asyncio.Task[None]]:
    stop = asyncio.Event()
    await worker.ensure_consumer()
    return stop, asyncio.create_task(worker.run(stop))


async def test_poison_message_is_parked_and_does_not_block_the_rest(
    nc: NATS, store: EventStore, topology: Topology
) -> None:
    ids = [new_id() for _ in range(5)]
    poison = ids[1]
    attempts: Counter[str] = Counter()
    done: list[str] = []

    async def handle(msg: Msg) -> None:
        aggregate_id = msg.subject.rsplit(".", 1)[-1]
        attempts[aggregate_id] += 1
        if aggregate_id == poison:
            raise ValueError("cannot handle this one")
        done.append(aggregate_id)

    worker = PullWorker(nc, spec(topology), handle, event_parker(store, "worker"))
    stop, task = await run_worker(worker)
    for i in ids:
        await store.append(i, [ProjectCreated(name=i, owner_id="u")], 0)

    parked = await eventually(
        lambda: store.load("consumer", "worker"), lambda s: s.version == 1, what="parked event"
    )
    stop.set()
    await task

    assert sorted(done) == sorted(i for i in ids if i != poison)
    assert attempts[poison] == 3  # max_deliver, then parked
    assert all(attempts[i] == 1 for i in ids if i != poison)
    record = parked.events[0].data
    assert isinstance(record, MessageParked)
    assert record.subject == topology.event_subject("project", poison)
    assert record.deliveries == 3
    assert "cannot handle this one" in record.error


async def test_transient_failure_is_retried_then_acked(
    nc: NATS, store: EventStore, topology: Topology
) -> None:
    attempts: Counter[str] = Counter()

    async def flaky(msg: Msg) -> None:
        attempts[msg.subject] += 1
        if attempts[msg.subject] < 2:
            raise ConnectionError("database blinked")

    worker = PullWorker(nc, spec(topology), flaky, event_parker(store, "worker"))
    stop, task = await run_worker(worker)
    pid = new_id()
    await store.append(pid, [ProjectCreated(name="x", owner_id="u")], 0)

    info = await eventually(
        lambda: nc.jetstream().consumer_info(topology.events_stream, "worker"),
        lambda i: i.num_ack_pending == 0 and i.delivered.stream_seq >= 1 and bool(attempts),
        what="the message to be acked",
    )
    stop.set()
    await task

    assert list(attempts.values()) == [2]
    assert info.num_pending == 0
    assert (await store.load("consumer", "worker")).version == 0  # nothing parked


async def test_slow_handler_keeps_its_message_with_heartbeats(
    nc: NATS, store: EventStore, topology: Topology
) -> None:
    deliveries: list[int] = []

    async def slow(msg: Msg) -> None:
        deliveries.append(msg.metadata.num_delivered)
        await asyncio.sleep(1.5)  # three times the ack wait

    worker = PullWorker(nc, spec(topology, ack_wait=0.5), slow, event_parker(store, "worker"))
    stop, task = await run_worker(worker)
    await store.append(new_id(), [ProjectCreated(name="x", owner_id="u")], 0)

    await eventually(
        lambda: nc.jetstream().consumer_info(topology.events_stream, "worker"),
        lambda i: i.ack_floor.stream_seq >= 1,
        what="the slow message to be acked",
    )
    stop.set()
    await task

    assert deliveries == [1]  # never redelivered while the handler worked on it


async def test_a_message_whose_parking_failed_on_its_last_delivery_comes_back_and_is_parked(
    nc: NATS, store: EventStore, topology: Topology
) -> None:
    """Before, the consumer's own `max_deliver` was the worker's: JetStream never delivered
    the message again after a failed park on that last delivery, and it was lost unrecorded."""
    parks: list[int] = []
    park = event_parker(store, "worker")

    async def handle(msg: Msg) -> None:
        raise ValueError("cannot handle this one")

    async def flaky_park(msg: Msg, error: BaseException, deliveries: int) -> None:
        parks.append(deliveries)
        if len(parks) == 1:
            raise ConnectionError("NATS blinked")
        await park(msg, error, deliveries)

    worker = PullWorker(nc, spec(topology), handle, flaky_park)
    stop, task = await run_worker(worker)
    pid = new_id()
    await store.append(pid, [ProjectCreated(name="x", owner_id="u")], 0)

    parked = await eventually(
        lambda: store.load("consumer", "worker"), lambda s: s.version == 1, what="parked event"
    )
    stop.set()
    await task
    assert parks == [3, 4]  # spent at the third delivery; the fourth is parked
    record = parked.events[0].data
    assert isinstance(record, MessageParked)
    assert record.subject == topology.event_subject("project", pid)


async def test_a_consumer_made_with_a_server_side_limit_loses_it(
    nc: NATS, store: EventStore, topology: Topology
) -> None:
    """A durable consumer an earlier version made keeps its name: its limit is lifted."""
    old = spec(topology).config()
    old.max_deliver = 3
    await nc.jetstream().add_consumer(topology.events_stream, old)
    worker = PullWorker(nc, spec(topology), lambda _: asyncio.sleep(0), event_parker(store, "w"))
    await worker.ensure_consumer()
    info = await nc.jetstream().consumer_info(topology.events_stream, "worker")
    assert info.config.max_deliver == -1


async def test_a_batchs_messages_waiting_their_turn_are_kept_alive(
    nc: NATS, store: EventStore, topology: Topology
) -> None:
    """Two replicas; one slot each, batches of four handled in 0.8 s each against an ack wait
    of 1 s: the messages waiting their turn had no `in_progress` until their handling began,
    so the server handed them to the other replica too, counting deliveries never tried."""
    deliveries: dict[str, list[int]] = {}

    async def handle(msg: Msg) -> None:
        deliveries.setdefault(msg.subject, []).append(msg.metadata.num_delivered)
        await asyncio.sleep(0.8)

    ids = [new_id() for _ in range(4)]
    for i in ids:
        await store.append(i, [ProjectCreated(name=i, owner_id="u")], 0)
    replicas = [
        PullWorker(
            nc,
            spec(topology, ack_wait=1.0, batch=4, concurrency=1),
            handle,
            event_parker(store, "w"),
        )
        for _ in range(2)
    ]
    running = [await run_worker(worker) for worker in replicas]
    await eventually(
        lambda: asyncio.sleep(0, len(deliveries)), lambda n: n == 4, timeout=20, what="all handled"
    )
    await asyncio.sleep(4.0)  # the batch handled, and any redelivery with it
    for stop, task in running:
        stop.set()
        await task
    assert all(counts == [1] for counts in deliveries.values()), deliveries
