"""The pool backend with real workers (`python -m suzumio.runner worker` processes) on real NATS.

The runners really run. Where they should end fast, the broker answers 401 (the runner is
fenced: exit 6) or does not exist (exit 7); where they should hang, the broker accepts the
connection and never answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import psutil
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import ConsumerInfo

from suzumio.contracts.ids import new_id
from suzumio.contracts.runner import (
    ActivationSpec,
    AgentSpec,
    FileRef,
    PoolCancel,
    PoolStatus,
    ProjectRef,
    RunnerActivationInput,
    SessionRef,
    SignalSpec,
)
from suzumio.contracts.subjects import ARTIFACTS_BUCKET, Topology, blob_name
from suzumio.contracts.values import Backend, ModelSpec, Priority, RuntimeProfileSpec, SignalKind
from suzumio.orchestrator.backends.base import Exit, Handle, LaunchError, LaunchPlan, MountPlan
from suzumio.orchestrator.backends.pool import PoolBackend, PoolSettings, exit_of
from suzumio.platform.bus import connection
from suzumio.platform.bus.kv import ensure_object_store
from tests.support import start_pool_worker

HEARTBEAT_TIMEOUT = 2.0
ACK_WAIT = 4.0
SECRET = "sk-test-secret-value"


def make_plan(
    broker_url: str,
    tmp_path: Path,
    *,
    session_id: str = "s1",
    pool: str | None = None,
    deadline: datetime | None = None,
    prompt: str = "be brief",
) -> LaunchPlan:
    activation_id = new_id()
    signal_spec = SignalSpec(id=new_id(), kind=SignalKind.TIMER, priority=Priority.P3)
    spec = RunnerActivationInput(
        project=ProjectRef(id="p1", name="project"),
        agent=AgentSpec(id="a1", role="tester", prompt=prompt, model=ModelSpec(name="m")),
        session=SessionRef(id=session_id),
        activation=ActivationSpec(id=activation_id, signals=(signal_spec,)),
        controller_url=broker_url,
        token="not-a-real-token",
    )
    return LaunchPlan(
        activation_id=activation_id,
        session_id=session_id,
        project_id="p1",
        agent_id="a1",
        attempt=1,
        input=spec,
        profile=RuntimeProfileSpec(backend=Backend.POOL, pool=pool),
        env={"SUZUMIO_MODEL_API_KEY": SECRET, "SUZUMIO_ACTIVATION_ID": activation_id},
        secret_keys=frozenset({"SUZUMIO_MODEL_API_KEY"}),
        host_dir=tmp_path / activation_id,
        session_dir=tmp_path / session_id,
        deadline=deadline,
    )


# -- brokers the runner talks to ------------------------------------------------------------
class Hanging:
    """Accepts connections and never answers; counts the ones still open."""

    def __init__(self) -> None:
        self.open = 0
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        try:
            while await reader.read(4096):
                pass
        finally:
            self.open -= 1
            writer.close()


async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        await reader.readuntil(b"\r\n\r\n")
        body = b'{"title":"fenced"}'
        writer.write(
            b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/problem+json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
    writer.close()


@pytest_asyncio.fixture
async def fenced_url() -> AsyncIterator[str]:
    """A broker that refuses every token: the runner exits 6 at its first call."""
    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    server.close()


@pytest_asyncio.fixture
async def hanging() -> AsyncIterator[tuple[str, Hanging]]:
    state = Hanging()
    server = await asyncio.start_server(state.handle, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", state
    server.close()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# -- workers and the backend ----------------------------------------------------------------
StartWorker = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def workers(nats_url: str, topology: Topology, tmp_path: Path) -> Iterator[StartWorker]:
    started: list[subprocess.Popen[bytes]] = []

    def start(
        worker_id: str, *extra: str, concurrency: int = 1, pool: str = "default",
        idle_ttl: float = 0,
    ) -> subprocess.Popen[bytes]:  # fmt: skip
        proc = start_pool_worker(
            nats_url, topology.namespace, tmp_path / "work", tmp_path / f"{worker_id}.log",
            "--pool", pool, "--worker-id", worker_id, "--concurrency", str(concurrency),
            "--heartbeat", "0.3", "--kill-grace", "1", "--drain", "1",
            "--idle-ttl", str(idle_ttl), *extra,
        )  # fmt: skip
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in started:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


SETTINGS = PoolSettings(
    pools=("default",),
    heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT,
    ack_wait_seconds=ACK_WAIT,
    worker_alive_seconds=2.0,
    list_timeout_seconds=0.3,
)


@pytest_asyncio.fixture
async def backend(nc: NATS, topology: Topology) -> AsyncIterator[PoolBackend]:
    created = PoolBackend(nc, topology, SETTINGS)
    yield created
    await created.close()


async def eventually(check: Callable[[], object], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not await _holds(check):
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout} s: {check}")
        await asyncio.sleep(0.1)


async def _holds(check: Callable[[], object]) -> bool:
    result = check()
    if asyncio.iscoroutine(result):
        result = await result
    return bool(result)


async def wait_workers(backend: PoolBackend, *ids: str, pool: str = "default") -> None:
    async def ready() -> bool:
        health = await backend.health()
        return set(ids) <= set(health.detail.get("pools", {}).get(pool, {}).get("workers", []))

    await eventually(ready, timeout=20)


class Statuses:
    """Every status the workers publish in this namespace."""

    def __init__(self) -> None:
        self.seen: list[PoolStatus] = []

    async def on(self, msg: Msg) -> None:
        self.seen.append(PoolStatus.model_validate_json(msg.data))

    def of(self, dispatch: str, kind: str | None = None) -> list[PoolStatus]:
        return [s for s in self.seen if s.dispatch_id == dispatch and kind in {None, s.kind}]


@pytest_asyncio.fixture
async def statuses(nc: NATS, topology: Topology) -> AsyncIterator[Statuses]:
    recorder = Statuses()
    sub = await nc.subscribe(topology.pool_status_subject("*"), cb=recorder.on)
    yield recorder
    await sub.unsubscribe()


async def consumer(nc: NATS, topology: Topology, pool: str = "default") -> ConsumerInfo:
    info: ConsumerInfo = await nc.jetstream().consumer_info(
        topology.activations_stream, topology.pool_consumer(pool)
    )
    return info


async def queue_is_empty(nc: NATS, topology: Topology, pool: str = "default") -> bool:
    info = await consumer(nc, topology, pool)
    stream = await nc.jetstream().stream_info(topology.activations_stream)
    return info.num_pending == 0 and info.num_ack_pending == 0 and stream.state.messages == 0


async def handed_out_once(nc: NATS, topology: Topology, pool: str = "default") -> None:
    """The pool's only dispatch left the queue (acked or deleted: nothing can hand it out
    again), and the queue handed it out once — no redelivery to another worker."""
    await eventually(lambda: queue_is_empty(nc, topology, pool), timeout=ACK_WAIT + 10)
    delivered = (await consumer(nc, topology, pool)).delivered
    assert delivered is not None
    assert delivered.consumer_seq == 1, delivered


async def watch(backend: PoolBackend, handle: Handle, timeout: float = 45.0) -> Exit:
    return await asyncio.wait_for(backend.watch(handle), timeout)


# -- the tests ------------------------------------------------------------------------------
async def test_a_retried_launch_is_one_dispatch_and_a_queued_cancel_removes_it(
    backend: PoolBackend, nc: NATS, topology: Topology, tmp_path: Path
) -> None:
    plan = make_plan(closed_port_url(), tmp_path)
    first = await backend.launch(plan)
    again = await backend.launch(plan)
    assert first.sandbox_id == again.sandbox_id == f"{plan.activation_id}.1"
    assert first.data["seq"] == again.data["seq"]
    assert (await consumer(nc, topology)).num_pending == 1

    listed = {h.sandbox_id: h for h in await backend.list_live()}
    assert listed[first.sandbox_id].data["state"] == "queued"
    health = await backend.health()
    assert not health.ok  # no worker serves the pool
    assert health.detail["pools"]["default"] == {
        "workers": [], "capacity": 0, "running": 0, "pending": 1, "in_flight": 0,
    }  # fmt: skip

    with pytest.raises(TimeoutError):  # the orchestrator's own timeout, as on a wall clock
        await watch(backend, first, timeout=0.5)
    await backend.cancel(first)
    assert await watch(backend, first) == Exit(
        None, "cancelled", "cancelled before a worker started it"
    )
    assert await queue_is_empty(nc, topology)


async def test_a_replica_that_stops_leading_forgets_its_dispatches_and_can_watch_again(
    backend: PoolBackend, workers: StartWorker, tmp_path: Path, fenced_url: str
) -> None:
    """Released (its replica stopped leading), the backend keeps none of the dispatches it
    watched — a dispatch's body holds the activation's token — and leading again it watches
    one from the start."""
    queued = await backend.launch(make_plan(fenced_url, tmp_path))
    assert queued.sandbox_id in backend._trackers  # noqa: SLF001 -- what it keeps is the point
    await backend.release()
    assert backend._trackers == {}  # noqa: SLF001
    workers("wa")
    assert (await watch(backend, queued)).code == 6  # the worker ran it; heard all the same


async def test_host_mounts_are_refused(backend: PoolBackend, tmp_path: Path) -> None:
    plan = make_plan(closed_port_url(), tmp_path)
    mounted = replace(plan, mounts=(MountPlan(tmp_path, "/data"),))
    with pytest.raises(LaunchError) as caught:
        await backend.launch(mounted)
    assert not caught.value.retryable


async def test_a_dispatch_larger_than_the_servers_max_payload_fails_for_good(
    backend: PoolBackend, nc: NATS, topology: Topology, tmp_path: Path
) -> None:
    plan = make_plan(closed_port_url(), tmp_path)
    prompt = "x" * nc.max_payload  # the same on every attempt
    agent = plan.input.agent.model_copy(update={"prompt": prompt})
    large = replace(plan, input=plan.input.model_copy(update={"agent": agent}))
    with pytest.raises(LaunchError) as caught:
        await backend.launch(large)
    assert not caught.value.retryable
    assert "max_payload" in str(caught.value)
    stream = await nc.jetstream().stream_info(topology.activations_stream)
    assert stream.state.messages == 0
    assert await backend.list_live() == []  # nothing tracked for it


async def test_an_unreachable_broker_exits_7_and_the_dispatch_is_acked(
    backend: PoolBackend, workers: StartWorker, statuses: Statuses, nc: NATS,
    topology: Topology, tmp_path: Path,
) -> None:  # fmt: skip
    workers("wa")
    await wait_workers(backend, "wa")
    handle = await backend.launch(make_plan(closed_port_url(), tmp_path))

    result = await watch(backend, handle)

    assert (result.code, result.reason) == (7, "exited")
    assert [s.worker_id for s in statuses.of(handle.sandbox_id, "started")] == ["wa"]
    await eventually(lambda: queue_is_empty(nc, topology), timeout=5)
    assert SECRET not in (tmp_path / "wa.log").read_text()


async def test_an_end_whose_ack_was_confirmed_is_not_taken_out_of_the_queue_again(
    backend: PoolBackend, workers: StartWorker, statuses: Statuses, nc: NATS,
    topology: Topology, tmp_path: Path,
) -> None:  # fmt: skip
    """A worker acks a run's dispatch before it reports the end, and says the server confirmed
    the ack: the dispatch has left the queue, so the cleanup asks the server for nothing more
    (a delete was a JetStream request, and its advisory, for every activation). The end of a
    worker that died before its ack is in `test_crash_windows_review`."""
    deletes: list[str] = []

    async def on_delete(msg: Msg) -> None:
        deletes.append(msg.subject)

    sub = await nc.subscribe(
        f"$JS.API.STREAM.MSG.DELETE.{topology.activations_stream}", cb=on_delete
    )
    workers("wa")
    await wait_workers(backend, "wa")
    handle = await backend.launch(make_plan(closed_port_url(), tmp_path))

    result = await watch(backend, handle)
    await backend.cleanup(handle, succeeded=False)
    await nc.flush()

    assert result.code == 7
    [end] = statuses.of(handle.sandbox_id, "exited")
    assert end.acked
    assert await queue_is_empty(nc, topology)
    assert deletes == []
    await sub.unsubscribe()


async def test_cancel_kills_the_running_runner(
    backend: PoolBackend, workers: StartWorker, statuses: Statuses, nc: NATS,
    topology: Topology, tmp_path: Path, hanging: tuple[str, Hanging],
) -> None:  # fmt: skip
    url, broker = hanging
    workers("wa")
    await wait_workers(backend, "wa")
    handle = await backend.launch(make_plan(url, tmp_path))
    await eventually(lambda: broker.open > 0)  # the runner is waiting on its broker call
    with pytest.raises(TimeoutError):  # the orchestrator's own timeout, as on a wall clock
        await watch(backend, handle, timeout=0.5)

    await backend.cancel(handle)
    result = await watch(backend, handle, timeout=15)

    assert result.reason == "killed"
    assert result.detail.startswith("cancelled")
    assert result.code == 9  # the runner ended on SIGTERM
    await eventually(lambda: queue_is_empty(nc, topology), timeout=5)
    listed = {h.sandbox_id: h for h in await backend.list_live()}
    assert listed[handle.sandbox_id].data["state"] == "exited"  # ended lately, not live
    await eventually(lambda: broker.open == 0, timeout=5)


@pytest.mark.parametrize("idle_ttl", [0, 30], ids=["forked_runner", "resident_runner"])
async def test_a_killed_worker_is_lost_and_its_attempt_never_runs_again(
    backend: PoolBackend, workers: StartWorker, statuses: Statuses, nc: NATS,
    topology: Topology, tmp_path: Path, hanging: tuple[str, Hanging], idle_ttl: float,
) -> None:  # fmt: skip
    url, broker = hanging
    doomed = workers("wa", idle_ttl=idle_ttl)
    await wait_workers(backend, "wa")
    handle = await backend.launch(make_plan(url, tmp_path))
    await eventually(lambda: statuses.of(handle.sandbox_id, "started"))
    await eventually(lambda: broker.open > 0)  # its runner is up, waiting on its broker call
    workers("wb")
    await wait_workers(backend, "wb")
    watching = asyncio.create_task(watch(backend, handle, timeout=20))
    await asyncio.sleep(0.5)

    os.kill(doomed.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    result = await watching

    assert (result.code, result.reason) == (None, "lost")
    assert time.monotonic() - killed_at < HEARTBEAT_TIMEOUT + 2.5
    await eventually(lambda: broker.open == 0, timeout=5)  # its runner died with it
    # The dispatch was withdrawn when it was declared lost: once it has left the queue (no
    # waiting for its ack wait to pass), it was handed out once, to wa, and never can be again.
    await handed_out_once(nc, topology)
    assert [s.worker_id for s in statuses.of(handle.sandbox_id, "started")] == ["wa"]


async def test_an_attempt_that_ended_while_no_orchestrator_watched_is_found_with_its_exit(
    nc: NATS, topology: Topology, workers: StartWorker, statuses: Statuses,
    tmp_path: Path, fenced_url: str,
) -> None:  # fmt: skip
    first = PoolBackend(nc, topology, SETTINGS)
    workers("wa")
    await wait_workers(first, "wa")
    launched = await first.launch(make_plan(fenced_url, tmp_path))
    await first.close()  # its orchestrator is gone; the runner ends meanwhile (exit 6)
    await eventually(lambda: statuses.of(launched.sandbox_id, "exited"))
    await eventually(lambda: queue_is_empty(nc, topology), timeout=5)

    second = PoolBackend(nc, topology, SETTINGS)  # the next leader
    try:
        found = {h.sandbox_id: h for h in await second.list_live()}
        assert found[launched.sandbox_id].data["state"] == "exited"
        assert found[launched.sandbox_id].ended  # nothing to stop: not an orphan to clean
        result = await watch(second, found[launched.sandbox_id], timeout=5)
    finally:
        await second.close()
    assert (result.code, result.reason) == (6, "exited")  # as it ended, not lost


async def test_a_dispatch_whose_start_and_end_were_missed_is_asked_about_not_waited_out(
    nc: NATS, topology: Topology, workers: StartWorker, statuses: Statuses,
    tmp_path: Path, fenced_url: str,
) -> None:  # fmt: skip
    first = PoolBackend(nc, topology, SETTINGS)
    queued = await first.launch(make_plan(fenced_url, tmp_path))  # due in an hour
    await first.close()
    workers("wa")  # takes it and runs it to its end while nobody listens
    await eventually(lambda: statuses.of(queued.sandbox_id, "exited"), timeout=20)

    second = PoolBackend(nc, topology, SETTINGS)
    try:
        asked_at = time.monotonic()
        result = await watch(second, queued, timeout=HEARTBEAT_TIMEOUT + 10)
    finally:
        await second.close()
    assert (result.code, result.reason) == (6, "exited")
    assert time.monotonic() - asked_at < HEARTBEAT_TIMEOUT + 5


async def test_a_dispatch_is_held_while_its_files_come_in_for_longer_than_the_ack_wait(
    nc: NATS, topology: Topology, workers: StartWorker, statuses: Statuses,
    tmp_path: Path, fenced_url: str,
) -> None:  # fmt: skip
    ack_wait = 1.0
    settings = PoolSettings(heartbeat_timeout_seconds=0.5, ack_wait_seconds=ack_wait)
    backend = PoolBackend(nc, topology, settings)
    store = await ensure_object_store(nc.jetstream(), topology.bucket(ARTIFACTS_BUCKET))
    data = b"x" * 1_000
    digest = hashlib.sha256(data).hexdigest()
    await store.put(blob_name(digest), data)
    # A thousand files take the worker seconds to bring in (each is a read of the store).
    inputs = tuple(FileRef(path=f"f{i}.txt", sha256=digest, size=len(data)) for i in range(1_000))
    workers("wa")
    workers("wb")
    try:
        await wait_workers(backend, "wa", "wb")
        plan = replace(make_plan(fenced_url, tmp_path), inputs=inputs)
        launched_at = time.monotonic()
        handle = await backend.launch(plan)
        # ~6 s on an idle machine; past 30 s on a busy one (CI's other tests beside it, the
        # worker at its batch CPU priority): bounded generously, it is no timing claim.
        await eventually(lambda: statuses.of(handle.sandbox_id, "started"), timeout=120)
        assert time.monotonic() - launched_at > ack_wait  # else this proves nothing
        await eventually(lambda: statuses.of(handle.sandbox_id, "exited"), timeout=60)
        await handed_out_once(nc, topology)  # never redelivered while its files came in
    finally:
        await backend.close()
    assert len(statuses.of(handle.sandbox_id, "started")) == 1  # one worker ran it, once
    assert len(statuses.of(handle.sandbox_id, "exited")) == 1


async def test_a_redelivered_dispatch_runs_only_within_its_deadline(
    backend: PoolBackend, workers: StartWorker, statuses: Statuses, nc: NATS,
    topology: Topology, tmp_path: Path, fenced_url: str,
) -> None:  # fmt: skip
    soon = datetime.now(UTC) + timedelta(seconds=ACK_WAIT - 1.5)
    in_time = await backend.launch(make_plan(fenced_url, tmp_path))
    too_late = await backend.launch(make_plan(fenced_url, tmp_path, deadline=soon))
    # A worker takes both and dies before starting either: nothing acks, nothing says started.
    js = nc.jetstream()
    held = await js.pull_subscribe_bind(
        topology.pool_consumer("default"), stream=topology.activations_stream
    )
    assert len(await held.fetch(2, timeout=5)) == 2
    await held.unsubscribe()
    workers("wb")

    result = await watch(backend, in_time, timeout=30)

    assert (result.code, result.reason) == (6, "exited")  # redelivered to wb and run
    assert [s.worker_id for s in statuses.of(in_time.sandbox_id, "started")] == ["wb"]
    await eventually(lambda: statuses.of(too_late.sandbox_id, "refused"), timeout=10)
    [refused] = statuses.of(too_late.sandbox_id, "refused")
    assert (refused.worker_id, refused.reason) == ("wb", "deadline")
    assert not statuses.of(too_late.sandbox_id, "started")
    await eventually(lambda: queue_is_empty(nc, topology), timeout=5)


async def test_a_dispatch_started_by_a_worker_that_died_unwatched_never_runs_again(
    nc: NATS, workers: StartWorker, statuses: Statuses, topology: Topology, tmp_path: Path,
    hanging: tuple[str, Hanging],
) -> None:  # fmt: skip
    """No orchestrator leads while a worker dies mid-run (none takes the dispatch out of the
    queue): the queue hands it out again after the ack wait, and the next worker must not
    run the attempt a second time beside what the first did, with a token still good."""
    url, _ = hanging  # the runner waits on its first broker call: it runs until killed
    backend = PoolBackend(nc, topology, SETTINGS)
    handle = await backend.launch(make_plan(url, tmp_path))
    await backend.close()  # no orchestrator from here on
    first = workers("wa")
    await eventually(lambda: statuses.of(handle.sandbox_id, "started"), timeout=30)
    first.kill()
    first.wait(timeout=10)
    workers("wb")
    await eventually(lambda: statuses.of(handle.sandbox_id, "refused"), timeout=ACK_WAIT + 30)
    [refused] = statuses.of(handle.sandbox_id, "refused")
    assert (refused.worker_id, refused.reason) == ("wb", "claimed")
    assert [s.worker_id for s in statuses.of(handle.sandbox_id, "started")] == ["wa"]
    await eventually(lambda: queue_is_empty(nc, topology), timeout=5)
    assert exit_of(refused).reason == "lost"  # the attempt fails, retryable: a new one runs


class CuttableLink:
    """A TCP relay to the NATS server whose connections can be cut, and new ones refused,
    for a while: one client's own outage, the server and everyone else fine."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.down = False
        self.writers: set[asyncio.StreamWriter] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    def cut(self) -> None:
        self.down = True
        for writer in list(self.writers):
            writer.transport.abort()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        self.writers.update({writer, up_writer})

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            for w in (writer, up_writer):
                w.transport.abort()
                self.writers.discard(w)

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def close(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()


async def test_the_orchestrators_own_outage_declares_no_running_dispatch_lost(
    nats_url: str, workers: StartWorker, statuses: Statuses, topology: Topology,
    tmp_path: Path, hanging: tuple[str, Hanging],
) -> None:  # fmt: skip
    """The orchestrator's link to NATS is down for longer than the heartbeat timeout, the
    workers' is not: what it did not hear meanwhile says nothing. Declared lost, each running
    dispatch failed, and the cancels it queued while away stopped healthy runs at its
    reconnect."""
    url, _ = hanging
    parsed = urllib.parse.urlsplit(nats_url)
    link = CuttableLink((parsed.hostname or "127.0.0.1", parsed.port or 4222))
    port = await link.start()
    relayed = parsed._replace(netloc=f"{parsed.netloc.rsplit('@', 1)[0]}@127.0.0.1:{port}")
    nc = await connection.connect(urllib.parse.urlunsplit(relayed), "suzumio-test-relayed")
    backend = PoolBackend(nc, topology, SETTINGS)
    workers("wa")
    try:
        await wait_workers(backend, "wa")
        handle = await backend.launch(make_plan(url, tmp_path))
        watching = asyncio.create_task(backend.watch(handle))
        await eventually(lambda: statuses.of(handle.sandbox_id, "started"), timeout=30)
        link.cut()
        await asyncio.sleep(HEARTBEAT_TIMEOUT * 2 + 1)
        assert not watching.done(), watching.result()
        link.down = False
        await eventually(lambda: nc.is_connected, timeout=10)
        await asyncio.sleep(HEARTBEAT_TIMEOUT + 1)  # its beats are heard again
        assert not watching.done(), watching.result()
        assert not statuses.of(handle.sandbox_id, "exited")  # it runs on
        await backend.cancel(handle)
        result = await asyncio.wait_for(watching, 30)
        assert result.reason == "killed"
    finally:
        await backend.close()
        await nc.close()
        await link.close()


async def test_a_dispatch_found_running_after_a_failover_can_still_be_taken_out(
    nc: NATS, workers: StartWorker, statuses: Statuses, topology: Topology, tmp_path: Path,
    hanging: tuple[str, Hanging],
) -> None:  # fmt: skip
    """A new leader finds a running dispatch through its worker's word, and its message in
    the queue (unacked while it runs): the handle must say where that is. Else, its worker
    dying later, the cleanup could not take it out, and the queue handed the ended attempt
    out again after the ack wait."""
    url, _ = hanging
    first = PoolBackend(nc, topology, SETTINGS)
    handle = await first.launch(make_plan(url, tmp_path))
    worker = workers("wa")
    await eventually(lambda: statuses.of(handle.sandbox_id, "started"), timeout=30)
    await first.close()  # the leader goes; another takes over
    second = PoolBackend(nc, topology, SETTINGS)
    try:
        [found] = [h for h in await second.list_live() if h.sandbox_id == handle.sandbox_id]
        assert found.data["state"] == "running"
        worker.kill()
        worker.wait(timeout=10)
        await second.cleanup(found, succeeded=False)
        stream = await nc.jetstream().stream_info(topology.activations_stream)
        assert stream.state.messages == 0
    finally:
        await second.close()


async def test_two_workers_share_ten_dispatches(
    backend: PoolBackend, workers: StartWorker, statuses: Statuses, nc: NATS,
    topology: Topology, tmp_path: Path, fenced_url: str,
) -> None:  # fmt: skip
    workers("wa", concurrency=2)
    workers("wb", concurrency=2)
    await wait_workers(backend, "wa", "wb")
    plans = [make_plan(fenced_url, tmp_path, session_id=f"s{i}") for i in range(10)]
    handles = [await backend.launch(p) for p in plans]

    results = await asyncio.gather(*(watch(backend, h, timeout=60) for h in handles))

    assert {(r.code, r.reason) for r in results} == {(6, "exited")}
    runners = [[s.worker_id for s in statuses.of(h.sandbox_id, "started")] for h in handles]
    assert all(len(r) == 1 for r in runners), runners  # each dispatch ran exactly once
    assert {r[0] for r in runners} == {"wa", "wb"}
    await eventually(lambda: queue_is_empty(nc, topology), timeout=5)


async def test_list_live_and_health_show_workers_runs_and_queue_depth(
    nc: NATS, topology: Topology, workers: StartWorker, statuses: Statuses,
    tmp_path: Path, hanging: tuple[str, Hanging],
) -> None:  # fmt: skip
    url, _ = hanging
    settings = PoolSettings(
        pools=("default", "spare"),
        heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT,
        ack_wait_seconds=ACK_WAIT,
        worker_alive_seconds=2.0,
        list_timeout_seconds=0.3,
    )
    backend = PoolBackend(nc, topology, settings)
    try:
        workers("wa", concurrency=2)
        workers("wb")
        await wait_workers(backend, "wa", "wb")
        running = [
            await backend.launch(make_plan(url, tmp_path, session_id=f"r{i}")) for i in range(3)
        ]
        queued = [
            await backend.launch(make_plan(url, tmp_path, session_id=f"q{i}", pool="spare"))
            for i in range(2)
        ]
        await eventually(lambda: all(statuses.of(h.sandbox_id, "started") for h in running))

        live = {h.sandbox_id: h for h in await backend.list_live()}
        assert set(live) == {h.sandbox_id for h in running + queued}
        assert {live[h.sandbox_id].data["state"] for h in running} == {"running"}
        assert {live[h.sandbox_id].data["state"] for h in queued} == {"queued"}
        assert {live[h.sandbox_id].data["worker_id"] for h in running} == {"wa", "wb"}

        health = await backend.health()
        assert not health.ok  # nobody serves "spare"
        default, spare = health.detail["pools"]["default"], health.detail["pools"]["spare"]
        assert default == {
            "workers": ["wa", "wb"], "capacity": 3, "running": 3, "pending": 0, "in_flight": 3,
        }  # fmt: skip
        assert (spare["workers"], spare["pending"]) == ([], 2)

        for handle in running + queued:
            await backend.cancel(handle)
        results = await asyncio.gather(*(watch(backend, h, timeout=15) for h in running + queued))
        assert [r.reason for r in results] == ["killed"] * 3 + ["cancelled"] * 2
        await eventually(lambda: queue_is_empty(nc, topology), timeout=5)
        assert (await consumer(nc, topology, "spare")).num_pending == 0
    finally:
        await backend.close()


async def test_a_worker_gone_from_presence_is_forgotten(
    nc: NATS, topology: Topology, workers: StartWorker
) -> None:
    """Each worker process has an id of its own: one that died leaves the health report
    once its presence is older than `worker_alive_seconds`, and the backend keeps nothing of
    it (else a pool whose workers restart often would grow the record without end)."""
    settings = PoolSettings(worker_alive_seconds=2.0, list_timeout_seconds=0.3)
    backend = PoolBackend(nc, topology, settings)
    try:
        workers("wa")
        gone = workers("wb")
        await wait_workers(backend, "wa", "wb")
        gone.kill()
        gone.wait()

        async def without_wb() -> bool:
            health = await backend.health()
            return bool(health.detail["pools"]["default"]["workers"] == ["wa"])

        await eventually(without_wb, timeout=15)
        assert set(backend._workers) == {"wa"}
    finally:
        await backend.close()


async def test_a_warm_session_keeps_its_workspace_for_the_idle_ttl(
    backend: PoolBackend, workers: StartWorker, statuses: Statuses, tmp_path: Path,
    fenced_url: str,
) -> None:  # fmt: skip
    workers("wa", idle_ttl=3)
    await wait_workers(backend, "wa")
    warm_dir = tmp_path / "work" / "wa" / "sessions" / "s1"

    first = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
    assert (await watch(backend, first)).code == 6
    [started] = statuses.of(first.sandbox_id, "started")
    [exited] = statuses.of(first.sandbox_id, "exited")
    assert (started.warm, exited.warm) == (False, True)
    assert warm_dir.is_dir()
    (warm_dir / "left-by-the-agent.txt").write_text("still here")

    second = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
    other = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s2"))
    assert (await watch(backend, second)).code == 6
    assert (await watch(backend, other)).code == 6
    assert [s.warm for s in statuses.of(second.sandbox_id, "started")] == [True]
    assert [s.warm for s in statuses.of(other.sandbox_id, "started")] == [False]
    assert (warm_dir / "left-by-the-agent.txt").read_text() == "still here"

    await eventually(lambda: not warm_dir.exists(), timeout=8)  # idle past its TTL


async def test_a_dispatch_whose_queueing_was_never_answered_is_not_run(
    nc: NATS, topology: Topology, workers: StartWorker, statuses: Statuses, tmp_path: Path,
    hanging: tuple[str, Hanging],
) -> None:  # fmt: skip
    """The queue's answers do not come in time (here: a timeout shorter than any answer), so
    the launch fails — and the attempt with it — though the dispatch may be queued all the
    same: no worker may run it then (or it must stop it at once)."""
    url, broker = hanging
    impatient = PoolBackend(
        nc, topology, SETTINGS.model_copy(update={"request_timeout_seconds": 1e-6})
    )
    workers("wa")
    try:
        await wait_workers(impatient, "wa")
        plan = make_plan(url, tmp_path)
        with pytest.raises(LaunchError, match="could not queue"):
            await impatient.launch(plan)
        did = impatient._dispatch(plan).dispatch_id
        await eventually(lambda: queue_is_empty(nc, topology), timeout=20)
    finally:
        await impatient.close()
    # Refused unstarted, or stopped at once: either way as cancelled, and only once.
    ends = [s.reason for s in statuses.of(did) if s.kind in {"refused", "exited"}]
    assert ends == ["cancelled"], statuses.of(did)
    assert broker.open == 0  # no runner of it is at work


class LosesFirstAnswer(PoolBackend):
    """The queue's first answer to each dispatch is lost: the dispatch was stored, but the
    publish times out (as when the answer was dropped on the way back)."""

    lost: ClassVar[list[str]] = []

    async def _publish(self, pool: str, did: str, body: bytes) -> dict[str, Any]:
        answer = await super()._publish(pool, did, body)
        if did not in self.lost:
            self.lost.append(did)
            raise TimeoutError("the answer did not come")
        return answer


async def test_a_dispatch_whose_first_answer_was_lost_is_queued_once_and_runs_once(
    nc: NATS, topology: Topology, workers: StartWorker, statuses: Statuses, tmp_path: Path,
    fenced_url: str,
) -> None:  # fmt: skip
    """Published again after the lost answer: the stream keeps it once (its id) and says
    where, the launch succeeds, and one worker runs it once."""
    lossy = LosesFirstAnswer(nc, topology, SETTINGS)
    workers("wa")
    try:
        await wait_workers(lossy, "wa")
        plan = make_plan(fenced_url, tmp_path)
        handle = await lossy.launch(plan)
        assert lossy.lost == [handle.sandbox_id]
        assert (await watch(lossy, handle)).code == 6  # the fenced broker's exit
    finally:
        await lossy.close()
    assert [s.kind for s in statuses.of(handle.sandbox_id) if s.kind != "heartbeat"] == [
        "started",
        "exited",
    ]
    stream = await nc.jetstream().stream_info(topology.activations_stream)
    assert stream.state.last_seq == handle.data["seq"]  # stored once, where it said
    assert await queue_is_empty(nc, topology)


async def test_a_dispatch_that_ended_here_and_comes_again_is_not_run_again(
    backend: PoolBackend, workers: StartWorker, statuses: Statuses, nc: NATS,
    topology: Topology, tmp_path: Path, fenced_url: str,
) -> None:  # fmt: skip
    """Its ack was lost (NATS unreachable as the worker acked it) and the queue hands it out
    again: the worker answers with the end it had, and does not run the activation twice."""
    workers("wa")
    await wait_workers(backend, "wa")
    plan = make_plan(fenced_url, tmp_path)
    handle = await backend.launch(plan)
    assert (await watch(backend, handle)).code == 6
    await eventually(lambda: queue_is_empty(nc, topology))  # acked, and so gone
    [first] = statuses.of(handle.sandbox_id, "exited")
    again = backend._dispatch(plan)  # the same dispatch, as a redelivery would hand it over
    assert again.dispatch_id == handle.sandbox_id
    await nc.jetstream().publish(
        topology.activation_subject("default"), again.model_dump_json().encode()
    )
    await eventually(lambda: len(statuses.of(handle.sandbox_id, "exited")) == 2)
    await eventually(lambda: queue_is_empty(nc, topology))
    assert len(statuses.of(handle.sandbox_id, "started")) == 1
    assert statuses.of(handle.sandbox_id, "exited")[1].exit_code == first.exit_code


async def test_a_warm_workspace_that_cannot_take_the_inputs_starts_afresh(
    backend: PoolBackend, workers: StartWorker, statuses: Statuses, nc: NATS,
    topology: Topology, tmp_path: Path, fenced_url: str,
) -> None:  # fmt: skip
    """The session's last activation left a directory where an input file now goes: the next
    activations start in a fresh workspace instead of failing, each of them, to start."""
    workers("wa", idle_ttl=30)
    await wait_workers(backend, "wa")
    warm_dir = tmp_path / "work" / "wa" / "sessions" / "s1"
    store = await ensure_object_store(nc.jetstream(), topology.bucket(ARTIFACTS_BUCKET))
    data = b"the report"
    digest = hashlib.sha256(data).hexdigest()
    await store.put(blob_name(digest), data)
    inputs = (FileRef(path="report.csv", sha256=digest, size=len(data)),)

    first = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
    assert (await watch(backend, first)).code == 6
    (warm_dir / "in" / "report.csv").mkdir(parents=True)  # as the agent left it
    (warm_dir / "kept.txt").write_text("the agent's")
    warm: list[bool] = []
    for _ in range(2):
        plan = replace(make_plan(fenced_url, tmp_path, session_id="s1"), inputs=inputs)
        handle = await backend.launch(plan)
        result = await watch(backend, handle)
        assert (result.code, result.reason) == (6, "exited"), result.detail
        warm += [s.warm for s in statuses.of(handle.sandbox_id, "started")]
    assert warm == [False, True]  # started afresh, then warm again
    assert (warm_dir / "in" / "report.csv").read_bytes() == data
    assert not (warm_dir / "kept.txt").exists()  # a fresh workspace, not patched up


async def test_a_warm_workspace_is_kept_when_the_store_cannot_give_an_input(
    backend: PoolBackend, workers: StartWorker, nc: NATS, topology: Topology, tmp_path: Path,
    fenced_url: str,
) -> None:  # fmt: skip
    """Not the workspace's fault (a blob missing, the store slow): the attempt fails to
    start, the session's workspace stays as it was for its next activation."""
    await ensure_object_store(nc.jetstream(), topology.bucket(ARTIFACTS_BUCKET))
    workers("wa", idle_ttl=30)
    await wait_workers(backend, "wa")
    warm_dir = tmp_path / "work" / "wa" / "sessions" / "s1"
    first = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
    assert (await watch(backend, first)).code == 6
    (warm_dir / "kept.txt").write_text("the agent's")
    missing = (FileRef(path="gone.csv", sha256="ab" * 32, size=3),)
    plan = replace(make_plan(fenced_url, tmp_path, session_id="s1"), inputs=missing)
    result = await watch(backend, await backend.launch(plan))
    assert result.code is None
    assert "gone.csv" in result.detail
    assert (warm_dir / "kept.txt").read_text() == "the agent's"


async def test_a_worker_told_to_stop_drains_then_stops_its_runs_and_reports_them(
    backend: PoolBackend, workers: StartWorker, nc: NATS, topology: Topology, tmp_path: Path,
    hanging: tuple[str, Hanging],
) -> None:  # fmt: skip
    url, broker = hanging
    worker = workers("wa")
    await wait_workers(backend, "wa")
    handle = await backend.launch(make_plan(url, tmp_path))
    await eventually(lambda: broker.open > 0)

    worker.send_signal(signal.SIGTERM)  # --drain 1: the hanging run is stopped after a second
    result = await watch(backend, handle, timeout=15)

    assert (result.code, result.reason) == (9, "killed")
    assert result.detail.startswith("shutdown")
    assert await asyncio.to_thread(worker.wait, 10) == 0
    await eventually(lambda: queue_is_empty(nc, topology), timeout=5)
    assert not (tmp_path / "work" / "wa").exists()


async def test_a_warm_sessions_runner_stays_for_its_next_activations(
    backend: PoolBackend, workers: StartWorker, statuses: Statuses, tmp_path: Path,
    fenced_url: str, hanging: tuple[str, Hanging],
) -> None:  # fmt: skip
    """With warm sessions, a session's runner process runs its next activations too (no fork,
    no exit); another environment, or an activation stopped mid-way, gets a fresh one."""
    workers("wa", "--resident-runs", "3", idle_ttl=30)
    await wait_workers(backend, "wa")

    async def run(plan: LaunchPlan) -> tuple[int | None, bool]:
        handle = await backend.launch(plan)
        result = await watch(backend, handle)
        [started] = statuses.of(handle.sandbox_id, "started")
        return result.code, started.resident

    assert await run(make_plan(fenced_url, tmp_path, session_id="s1")) == (6, False)
    assert await run(make_plan(fenced_url, tmp_path, session_id="s1")) == (6, True)
    assert await run(make_plan(fenced_url, tmp_path, session_id="s1")) == (6, True)
    assert await run(make_plan(fenced_url, tmp_path, session_id="s1")) == (6, False)  # 3 ran
    assert await run(make_plan(fenced_url, tmp_path, session_id="s2")) == (6, False)

    rotated = make_plan(fenced_url, tmp_path, session_id="s1")
    rotated = replace(rotated, env={**rotated.env, "SUZUMIO_MODEL_API_KEY": "sk-rotated"})
    assert await run(rotated) == (6, False)  # another environment: another runner
    assert await run(make_plan(fenced_url, tmp_path, session_id="s1")) == (6, False)

    url, broker = hanging  # cancelled mid-way: the runner goes with it
    handle = await backend.launch(make_plan(url, tmp_path, session_id="s1"))
    await eventually(lambda: broker.open > 0)
    [started] = statuses.of(handle.sandbox_id, "started")
    assert started.resident
    await backend.cancel(handle)
    assert (await watch(backend, handle, timeout=15)).reason == "killed"
    await eventually(lambda: broker.open == 0, timeout=5)
    assert await run(make_plan(fenced_url, tmp_path, session_id="s1")) == (6, False)
    assert await run(make_plan(fenced_url, tmp_path, session_id="s1")) == (6, True)


def fork_server_of(worker: subprocess.Popen[bytes]) -> int | None:
    """The pid of the worker's running fork server, if it has one."""
    for child in psutil.Process(worker.pid).children():
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE and "forkserver" in child.cmdline():
                return int(child.pid)
    return None


@pytest.mark.parametrize("idle_ttl", [0, 30], ids=["forked_runner", "resident_runner"])
async def test_a_worker_whose_fork_server_died_starts_another(
    backend: PoolBackend, workers: StartWorker, tmp_path: Path, fenced_url: str, idle_ttl: float
) -> None:
    """Killed for memory, say: the worker goes on running its dispatches, not failing each."""
    worker = workers("wf", idle_ttl=idle_ttl)
    await wait_workers(backend, "wf")
    first = await backend.launch(make_plan(fenced_url, tmp_path))
    assert (await watch(backend, first)).code == 6
    dead = fork_server_of(worker)
    assert dead is not None
    os.kill(dead, signal.SIGKILL)
    await eventually(lambda: not psutil.pid_exists(dead))  # the worker reaped it
    for _ in range(2):
        handle = await backend.launch(make_plan(fenced_url, tmp_path))
        result = await watch(backend, handle)
        assert (result.code, result.reason) == (6, "exited"), result.detail
    assert fork_server_of(worker) not in {None, dead}


async def test_a_resident_runner_takes_an_input_of_megabytes(
    backend: PoolBackend, workers: StartWorker, statuses: Statuses, tmp_path: Path,
    fenced_url: str,
) -> None:  # fmt: skip
    """A session's input grows with its history: a resident runner reads one of any size its
    worker can be sent (over the 64 KiB of a stream's default line), and stays for the next."""
    workers("wb", "--resident-runs", "5", idle_ttl=30)
    await wait_workers(backend, "wb")
    prompt = "a long brief " * 200_000  # 2.6 MB, as JSON in one request line
    for resident in (False, True, True):
        handle = await backend.launch(make_plan(fenced_url, tmp_path, prompt=prompt))
        result = await watch(backend, handle)
        [started] = statuses.of(handle.sandbox_id, "started")
        assert (result.code, started.resident) == (6, resident), result.detail


async def test_a_resident_runs_input_is_on_no_disk_and_its_failure_reports_its_own_lines(
    backend: PoolBackend, workers: StartWorker, statuses: Statuses, tmp_path: Path,
    fenced_url: str, hanging: tuple[str, Hanging],
) -> None:  # fmt: skip
    """A resident runner gets each activation's input in its request: no file holds the
    token while it runs. Its activations share its log; a failed one reports the lines it
    logged, not the ones of the activation before it."""
    workers("wr", "--resident-runs", "5", idle_ttl=30)
    await wait_workers(backend, "wr")
    first = make_plan(fenced_url, tmp_path, session_id="s1")
    assert (await watch(backend, await backend.launch(first))).code == 6
    second = make_plan(fenced_url, tmp_path, session_id="s1")
    handle = await backend.launch(second)
    result = await watch(backend, handle)
    [started] = statuses.of(handle.sandbox_id, "started")
    assert (result.code, started.resident) == (6, True)
    assert "activation.fenced" in result.detail
    assert second.activation_id in result.detail
    assert first.activation_id not in result.detail

    url, broker = hanging
    running = await backend.launch(make_plan(url, tmp_path, session_id="s1"))
    await eventually(lambda: broker.open > 0)
    [started] = statuses.of(running.sandbox_id, "started")
    assert started.resident
    files = [p for p in (tmp_path / "work").rglob("*") if p.is_file() and not p.is_symlink()]
    assert files, "the worker keeps nothing on disk at all?"
    assert not [p for p in files if b"not-a-real-token" in p.read_bytes()]
    await backend.cancel(running)
    assert (await watch(backend, running, timeout=15)).reason == "killed"


async def test_a_dispatch_the_queue_gives_up_on_is_lost_at_once_not_at_its_deadline(
    nc: NATS, topology: Topology, tmp_path: Path
) -> None:
    """Sent back by worker after worker (each full, or stopping) until its consumer's
    `max_deliver`, a dispatch is handed out no more: its attempt is lost (retryable) when
    JetStream says so, not left queued until its deadline. The workers here are a pull
    subscription of the pool's consumer that sends it back."""
    backend = PoolBackend(nc, topology, SETTINGS.model_copy(update={"max_deliver": 2}))
    psub = None
    try:
        handle = await backend.launch(make_plan(closed_port_url(), tmp_path))
        watching = asyncio.create_task(watch(backend, handle, timeout=30))
        psub = await nc.jetstream().pull_subscribe_bind(
            topology.pool_consumer("default"), stream=topology.activations_stream
        )
        for _ in range(2):
            [msg] = await psub.fetch(1, timeout=5)
            await msg.nak()
        with contextlib.suppress(TimeoutError):  # still pulling: nothing comes any more
            assert await psub.fetch(1, timeout=1) == []
        ended = await watching
        assert ended.reason == "lost"
        assert "handed its dispatch out 2 times" in ended.detail
        assert await queue_is_empty(nc, topology)
    finally:
        if psub is not None:
            await psub.unsubscribe()
        await backend.close()


async def test_a_run_heard_of_after_its_attempt_ended_here_is_stopped_again(
    backend: PoolBackend, nc: NATS, topology: Topology
) -> None:
    """Its worker was cut off past the heartbeat timeout: the attempt ended lost here, its one
    stop sent then (and missed). Back, the worker beats for that run again: it is stopped
    again, now — not left to run to its deadline (once per heartbeat timeout at most). A run
    of an attempt still watched is not."""
    ended = new_id()
    gone = Handle(ended, "pool", f"{ended}.1", {"left_queue": True})
    await backend.cleanup(gone, succeeded=False)  # the lost attempt's end, as the engine does it
    await backend._ensure_statuses()  # listening, as while it watches anything
    cancels: list[PoolCancel] = []

    async def on_cancel(msg: Msg) -> None:
        cancels.append(PoolCancel.model_validate_json(msg.data))

    sub = await nc.subscribe(topology.pool_cancel_subject("*"), cb=on_cancel)
    try:
        # Two beats of the ended run (one stop: at most one per heartbeat timeout), one of
        # a run of an attempt not ended here.
        beats = [(gone.sandbox_id, ended)] * 2 + [(f"{new_id()}.1", new_id())]
        for dispatch, activation in beats:
            beat = PoolStatus(
                kind="heartbeat", dispatch_id=dispatch, activation_id=activation, attempt=1,
                worker_id="wx", pool="default", at=datetime.now(UTC),
            )  # fmt: skip
            await nc.publish(
                topology.pool_status_subject(activation), beat.model_dump_json().encode()
            )
        await eventually(lambda: cancels)
        await asyncio.sleep(0.3)  # and no other
    finally:
        await sub.unsubscribe()
    assert cancels == [PoolCancel(dispatch_id=gone.sandbox_id)]
