"""Review of the event log machinery (bus, follower, commands, projections): each test pins a
failure found by reading the code."""

from __future__ import annotations

import asyncio
import warnings
from datetime import UTC, datetime, timedelta

import pytest
from nats.aio.client import Client as NATS
from nats.errors import MaxPayloadError
from nats.errors import TimeoutError as NatsTimeoutError

from suzumio.contracts.commands import CommandAccepted, RenameProject, UpdateAgent
from suzumio.contracts.errors import CommandTimeoutError, InvalidError
from suzumio.contracts.events import ProjectCreated
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus import eventstore, jsapi
from suzumio.platform.bus.commands import (
    CommandClient,
    CommandContext,
    CommandRouter,
    CommandServer,
)
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.bus.follower import LogFollower
from suzumio.platform.bus.kv import ensure_kv, ensure_object_store
from suzumio.platform.replica import Replica


def created(name: str = "p") -> ProjectCreated:
    return ProjectCreated(name=name, owner_id="user-1")


async def test_a_follower_from_a_start_time_survives_losing_its_consumer(
    nc: NATS, store: EventStore, topology: Topology
) -> None:
    # The ordered consumer recreates itself by start sequence when its heartbeats stop (the
    # server restarted, or lost the consumer); a follower begun "from a time" used to keep
    # that time in its config, which the server refuses beside a start sequence: silence.
    await store.append(new_id(), [created("old")], 0)
    follower = LogFollower(nc, topology, start_time=datetime.now(UTC) - timedelta(minutes=1))
    await follower.start()
    try:
        first = await follower.next(5.0)
        assert first is not None
        jsm = nc.jetstream()
        for info in await jsm.consumers_info(topology.events_stream):
            await jsm.delete_consumer(topology.events_stream, info.name)
        later = await store.append(new_id(), [created("new")], 0)
        got = await follower.next(40.0)  # two missed heartbeats (5 s each), then recreated
        assert got is not None, "the follower went silent after its consumer was recreated"
        assert got.seq == later.seq
    finally:
        await follower.close()


async def test_a_follower_from_a_start_time_begins_at_the_first_message_since(
    nc: NATS, store: EventStore, topology: Topology
) -> None:
    await store.append(new_id(), [created("before")], 0)
    await asyncio.sleep(0.1)
    since = datetime.now(UTC)
    await asyncio.sleep(0.1)
    after = await store.append(new_id(), [created("after")], 0)
    follower = LogFollower(nc, topology, start_time=since)
    assert await follower.start() == after.seq
    try:
        got = await follower.next(5.0)
        assert got is not None
        assert got.seq == after.seq
        assert follower.next_nowait() is None
        # And with nothing stored since: it begins after the end, and sees what comes next.
        await asyncio.sleep(0.1)
        quiet = LogFollower(nc, topology, start_time=datetime.now(UTC))
        assert await quiet.start() == after.seq
        try:
            newest = await store.append(new_id(), [created("newest")], 0)
            got = await quiet.next(5.0)
            assert got is not None
            assert got.seq == newest.seq
        finally:
            await quiet.close()
    finally:
        await follower.close()


async def test_a_refusal_too_large_for_the_bus_still_reaches_the_client_typed(
    nc: NATS, topology: Topology
) -> None:
    # Thousands of validation errors make a reply larger than the server's max_payload: it
    # never left, and the client waited out its timeout (CommandTimeoutError, "maybe applied").
    async def update(_: CommandContext[UpdateAgent]) -> CommandAccepted:
        raise AssertionError("must not run")

    router = CommandRouter("session")
    router.register(UpdateAgent, update)
    server = CommandServer(nc, topology, router)
    await server.start()
    await nc.flush()
    count = nc.max_payload // 20  # an error per item, each far larger than the item
    bad = UpdateAgent.model_construct(agent_id=new_id(), assets=[1] * count)  # type: ignore[arg-type]
    client = CommandClient(nc, topology, timeout=20.0)
    started = asyncio.get_running_loop().time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydantic on dumping the constructed garbage
        with pytest.raises(InvalidError) as info:
            await client.send(bad, actor="user:u1")
    assert asyncio.get_running_loop().time() - started < 15
    details = info.value.details
    assert len(details["errors"]) == 100
    assert details["errors_omitted"] >= count - 100
    assert details["errors"][0]["loc"].startswith("assets")
    await server.drain(2.0)


async def test_a_command_too_large_for_the_bus_is_a_typed_refusal(
    nc: NATS, topology: Topology, commands: CommandClient
) -> None:
    # nats-py refuses it before sending; callers that speak typed errors get one, and callers
    # that answer 413 on MaxPayloadError still do.
    huge = RenameProject.model_construct(project_id=new_id(), name="x" * nc.max_payload)
    with pytest.raises(InvalidError) as info:
        await commands.send(huge, actor="user:u1")
    assert isinstance(info.value, MaxPayloadError)
    assert "larger than the bus carries" in str(info.value)


async def test_a_refused_retry_whose_own_copy_cannot_be_looked_up_is_a_timeout(
    nc: NATS, store: EventStore, topology: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A retried publish refused as a conflict (10071; 10164 in a cluster, or past the
    # duplicate window) may be refused because its first attempt was stored. When the log
    # cannot be read to tell (NATS in trouble: just when acks get lost), the outcome is
    # unknown: a typed CommandTimeoutError, not a raw nats error turned into "internal".
    await jsapi.request(
        nc,
        f"{jsapi.API_PREFIX}.STREAM.UPDATE.{topology.events_stream}",
        {**jsapi.stream_config(topology.streams()[0]), "duplicate_window": 100_000_000},
        5.0,
    )
    prepared = await store.prepare(new_id(), [created()], 0)
    await store.commit(prepared)
    await asyncio.sleep(0.3)  # past the duplicate window: a retry meets the sequence check

    async def unreadable(*_: object, **__: object) -> None:
        raise NatsTimeoutError

    monkeypatch.setattr(eventstore, "first_after", unreadable)
    with pytest.raises(CommandTimeoutError):
        await store.commit(prepared)
    monkeypatch.undo()
    assert (await store.commit(prepared)).version == 1  # readable again: found as its own


async def test_a_replica_whose_fold_loop_fails_gives_up_leading_and_fails(
    nc: NATS, store: EventStore, topology: Topology, database_url: str
) -> None:
    # The fold loop ran as a task nobody watched: when it died (a message it could not
    # handle), the replica went on holding leadership with a state that no longer moved, so
    # it decided nothing and no standby could take over, while the service looked alive.
    await store.append(new_id(), [created()], 0)
    replica = Replica(nc, topology, database_url, "review")
    led = asyncio.Event()

    async def fold_loop(stop: asyncio.Event) -> None:
        await led.wait()
        msg = await replica.follower.next(5.0)
        assert msg is not None
        raise ValueError(f"cannot fold {msg.seq}")

    async def lead(done: asyncio.Event) -> None:
        led.set()
        await done.wait()

    stop = asyncio.Event()
    task = asyncio.create_task(replica.run(stop, fold_loop, lead))
    try:
        with pytest.raises(ValueError, match="cannot fold"):
            await asyncio.wait_for(asyncio.shield(task), 15)
        assert not replica.leadership.leading
        standby = Replica(nc, topology, database_url, "review")
        took_over = asyncio.Event()

        async def lead_too(done: asyncio.Event) -> None:
            took_over.set()
            await done.wait()

        async def idle(stop: asyncio.Event) -> None:
            await stop.wait()

        other = asyncio.Event()
        standing = asyncio.create_task(standby.run(other, idle, lead_too))
        await asyncio.wait_for(took_over.wait(), 10)
        other.set()
        await asyncio.wait_for(standing, 15)
    finally:
        stop.set()
        if not task.done():
            await asyncio.wait_for(task, 15)


async def test_a_bucket_made_with_other_settings_is_brought_to_the_ones_asked(
    nc: NATS, topology: Topology
) -> None:
    # A changed TTL setting (the gateway's idempotency window) or replica count met the
    # bucket an earlier start made: nats-py refused it as "already in use", every start.
    js = nc.jetstream()
    bucket = topology.bucket("review-kv")
    first = await ensure_kv(js, bucket, ttl=30)
    await first.put("k", b"v")
    again = await ensure_kv(js, bucket, ttl=300)
    assert (await again.get("k")).value == b"v"
    info = await js.stream_info(f"KV_{bucket}")
    assert info.config.max_age == 300
    assert info.config.duplicate_window == 120
    shorter = await ensure_kv(js, bucket, ttl=10)
    assert (await shorter.get("k")).value == b"v"
    info = await js.stream_info(f"KV_{bucket}")
    assert (info.config.max_age, info.config.duplicate_window) == (10, 10)
    objects = topology.bucket("review-obj")
    await ensure_object_store(js, objects)
    await ensure_object_store(js, objects)  # the same settings: as before, no change
