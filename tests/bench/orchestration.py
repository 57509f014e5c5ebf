"""Figures of the orchestrator and its backends, with the real services and a model that
answers at once (the scripted server, which records when each call came, for the latencies; the
no-op server, which costs ~60 µs of CPU a call, for the throughput):

- control-plane overhead: `activation.requested` stored → the backend is called to start the
  sandbox (plan, token, fold; the sandbox's own start excluded), per backend, and the backend's
  launch call itself;
- a user message (sent by a connected client through the gateway) → the first model call of
  its runner, per backend; for the pool, → the worker starting it (`started` on the pool's
  status subject);
- pool throughput: activations per second from requested to ended, with a no-op model, each
  session with one activation at a time (as the scheduler holds it), and where their CPU went
  (ms per activation: the runners with their worker, the orchestrator with this process, each
  service, and the rest of the machine).

The pool is measured twice: `pool`, a worker forking a runner per activation, and
`pool_warm_sessions`, a worker keeping sessions warm, whose runners stay for their session's
next activations (its message figures are a session's later messages). Its `throughput` starts
on new sessions (each one's first activation starts its runner); `throughput_sessions_warm`
runs as many activations again on the same sessions, whose runners are all there by then.

The throughput's worker runs 32 activations at once, spread over 48 sessions. A worker's
concurrency is its operator's choice, and an activation spends nearly all its life waiting on
its model, so a real worker holds many more at once than it has cores; with the no-op model,
32 in flight keep both cores busy, and each service handles several activations' messages per
wakeup. (Until 2026-12-04 the figure ran with 8 over 20 sessions, which left ~15% of the two
cores idle and woke every process once per message. Measured in turns within an hour on the
same code: 121 and 125/s with 8, 148 and 158/s with 16, 169 and 171/s with 32 over 48
sessions, 168/s with 64 over 96.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
from nats.aio.msg import Msg

from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.events import ActivationRequested
from suzumio.contracts.ids import new_id
from suzumio.contracts.runner import PoolStatus
from suzumio.orchestrator.backends.base import Backend
from suzumio.orchestrator.backends.docker import DockerBackend, DockerSettings
from suzumio.orchestrator.backends.pool import PoolBackend, PoolSettings
from suzumio.orchestrator.backends.process import ProcessBackend
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.platform.bus.eventstore import types_of
from suzumio.testing.model_server import NoopModelServer, Reply, ScriptedModelServer
from tests.backend_suite import TERMINAL, Harness, harness
from tests.bench.gateway import percentiles
from tests.e2e.api import World, ok
from tests.e2e.stack import Stack, running_stack
from tests.support import start_pool_worker

SERVICES = ("session", "scheduler", "toolbroker", "gateway")
TERMINAL_SET = frozenset(TERMINAL)
OVERHEAD_SAMPLES = 30
MESSAGE_SAMPLES = 10
THROUGHPUT_ACTIVATIONS = int(os.environ.get("SUZUMIO_BENCH_THROUGHPUT", "600"))
THROUGHPUT_SESSIONS = 48
WORKER_CONCURRENCY = 32
# A worker keeping sessions warm (each session's runner stays for its next activations), with
# room for every session the throughput figure spreads its activations over.
WARM_SESSIONS = ("--idle-ttl", "600", "--max-warm", "64")


@contextlib.asynccontextmanager
async def workers(
    stack: Stack, tmp: Path, *options: str
) -> AsyncIterator[list[subprocess.Popen[bytes]]]:
    tmp.mkdir(parents=True, exist_ok=True)
    procs = [
        start_pool_worker(
            stack.nats_url,
            stack.topology.namespace,
            tmp / "w",
            tmp / "worker.log",
            "--concurrency",
            str(WORKER_CONCURRENCY),
            *options,
        )
    ]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def factory(name: str, stack: Stack) -> Callable[[OrchestratorSettings], Awaitable[Backend]]:
    async def make(settings: OrchestratorSettings) -> Backend:
        match name:
            case "process":
                return ProcessBackend(settings.sandboxes())
            case "docker":
                return DockerBackend(DockerSettings(), settings.namespace)
        return PoolBackend(stack.nc, stack.topology, PoolSettings())

    return make


async def _request(h: Harness, world: World) -> tuple[str, float]:
    activation_id = new_id()
    at = time.time()
    await h.stack.store.append_next(
        world.session_id,
        [ActivationRequested(activation_id=activation_id, agent_id=world.agent_id, signal_ids=())],
        EventMeta(actor="system:scheduler"),
    )
    return activation_id, at


async def _ended(h: Harness, activation_id: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(t in TERMINAL for t in await h.story(activation_id)):
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(activation_id)


async def _overhead(h: Harness) -> dict[str, Any]:
    world = await h.world("ovh")
    control: list[float] = []
    launch: list[float] = []
    for _ in range(OVERHEAD_SAMPLES):
        activation_id, at = await _request(h, world)
        await _ended(h, activation_id)
        tracked = h.orchestrator.activations[activation_id]
        control.append(tracked.launching_at - at)
        launch.append(tracked.launched_at - tracked.launching_at)
    return {
        "requested_to_launch_call": percentiles(control),
        "launch_call": percentiles(launch),
        "targets": {"p50_ms": 20, "p99_ms": 100},
    }


async def _message_to_model(
    h: Harness, pool_started: dict[str, float] | None, *, warm: bool = False
) -> dict[str, Any]:
    """Each sample in a new session; `warm`: all in one session, after a first message (its
    later messages, which a warm session's worker runs on the runner it kept)."""
    to_model: list[float] = []
    to_worker: list[float] = []
    kept = await h.world("msgwarm") if warm else None
    for i in range(-1 if warm else 0, MESSAGE_SAMPLES):
        world = kept or await h.world(f"msg{i}")
        seen = len(h.model.requests)
        async with h.stack.client(world.key) as client:
            # A connected client, as a user's would be: building an HTTP client (its TLS
            # context alone takes 20-35 ms here) and connecting are not the platform's time.
            ok(await client.get(f"/v1/sessions/{world.session_id}"), 200)
            sent = time.monotonic()
            sent_wall = time.time()
            reply = await client.post(
                f"/v1/sessions/{world.session_id}/messages", json={"text": "hello"}
            )
            ok(reply, 201)
        while True:
            found = [r for r in h.model.requests[seen:] if world.session_id in str(r.messages[0])]
            if found:
                break
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.3)  # let it end before the next one
        if i < 0:
            continue  # the warm-up
        to_model.append(found[0].received_at - sent)
        if pool_started is not None:
            stream = await h.stack.store.load("session", world.session_id)
            activation_id = [
                e.data.activation_id
                for e in stream.events
                if isinstance(e.data, ActivationRequested)
            ][-1]
            to_worker.append(pool_started[activation_id] - sent_wall)
    out: dict[str, Any] = {"message_to_first_model_call": percentiles(to_model)}
    if pool_started is not None:
        out["message_to_worker_started"] = percentiles(to_worker)
    return out


def _cpu_seconds(pid: int, *, with_children: bool = False) -> float:
    """User and system CPU of a process (and of its descendants, reaped ones included)."""
    try:
        proc = psutil.Process(pid)
        procs = [proc, *(proc.children(recursive=True) if with_children else [])]
    except psutil.Error:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:  # ended since it was listed: its parent reaps its time
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def _machine_cpu_seconds() -> float:
    t = psutil.cpu_times()  # everything that ran, interrupts (loopback networking) included
    return float(t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0))


def _own_cpu_seconds(pid: int) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(t.user + t.system)


def _fork_servers(pool: list[int]) -> list[int]:
    found = []
    for pid in pool:
        with contextlib.suppress(psutil.Error):
            found += [c.pid for c in psutil.Process(pid).children() if "forkserver" in c.cmdline()]
    return found


def _cpu_by_part(h: Harness, pool: list[int]) -> dict[str, float]:
    parts = {
        "machine": _machine_cpu_seconds(),
        "orchestrator_and_bench": _cpu_seconds(os.getpid()),
        "worker_and_runners": sum(_cpu_seconds(pid, with_children=True) for pid in pool),
        # Of which: the workers themselves and their fork servers (the runners are the rest).
        "of_which_workers": sum(_own_cpu_seconds(pid) for pid in pool),
        "of_which_fork_servers": sum(_own_cpu_seconds(pid) for pid in _fork_servers(pool)),
    }
    for service in h.stack.processes:
        if service.process is not None:
            parts[service.name] = _cpu_seconds(service.process.pid)
    # The servers this process started (`make bench` runs them as its children).
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            name = child.name()
            if name in ("nats-server", "postgres"):
                part = "nats_server" if name == "nats-server" else "postgres"
                parts[part] = parts.get(part, 0.0) + _cpu_seconds(child.pid, with_children=True)
    return parts


def _nats_messages() -> dict[str, int]:
    """Messages in and out of the NATS server, per client connection name (the monitoring
    listener of the bench's own server), and in all."""
    url = os.environ.get("SUZUMIO_BENCH_NATS_MONITORING")
    if not url:
        return {}
    with urllib.request.urlopen(f"{url}/connz?limit=1024", timeout=10) as answer:
        connz = json.load(answer)
    counts: dict[str, int] = {}
    for conn in connz.get("connections", []):
        name = str(conn.get("name") or "unnamed").split(".")[0]
        counts[name] = counts.get(name, 0) + int(conn["in_msgs"]) + int(conn["out_msgs"])
    with urllib.request.urlopen(f"{url}/varz", timeout=10) as answer:
        varz = json.load(answer)
    counts["server_in"] = int(varz["in_msgs"])
    counts["server_out"] = int(varz["out_msgs"])
    return counts


async def _throughput(
    h: Harness, pool: list[int], resident: set[str], sessions: list[World]
) -> dict[str, Any]:
    # At most one live activation per session, as the scheduler holds it (DESIGN §6): a
    # session's next request goes when its last one ended. With more sessions than the worker
    # has slots, the queue never runs dry. (Requested all at once instead, a session's
    # activations would run side by side on its runner and on cold ones — which the platform
    # never does.) The ends are seen as they are stored (a subscription), not polled for:
    # reading every activation's story again and again would load the machine being measured.
    ids: list[str] = []
    live: dict[str, World] = {}
    ended: set[str] = set()
    ended_at: dict[str, float] = {}
    all_ended = asyncio.Event()
    requesting: set[asyncio.Task[None]] = set()
    issued = 0

    def next_of(world: World) -> None:
        nonlocal issued
        if issued >= THROUGHPUT_ACTIVATIONS:
            if not live and len(ids) == issued:
                all_ended.set()
            return
        issued += 1
        task = asyncio.create_task(request(world))
        requesting.add(task)
        task.add_done_callback(requesting.discard)

    async def request(world: World) -> None:
        activation_id, _ = await _request(h, world)
        ids.append(activation_id)
        live[activation_id] = world
        if activation_id in ended:  # it ended before its request's answer came back
            next_of(live.pop(activation_id))

    async def on_event(msg: Msg) -> None:
        if TERMINAL_SET.intersection(types_of(msg.headers) or ()):
            activation_id = msg.subject.rsplit(".", 1)[1]
            ended.add(activation_id)
            ended_at.setdefault(activation_id, time.perf_counter())
            if activation_id in live:
                next_of(live.pop(activation_id))

    sub = await h.stack.nc.subscribe(h.stack.topology.events_filter("activation"), cb=on_event)
    try:
        msgs_before = _nats_messages()
        cpu_before = _cpu_by_part(h, pool)
        started = time.perf_counter()
        for world in sessions:
            next_of(world)
        await asyncio.wait_for(all_ended.wait(), 600)
        elapsed = time.perf_counter() - started
    finally:
        await sub.unsubscribe()
    cpu = {k: v - cpu_before[k] for k, v in _cpu_by_part(h, pool).items()}
    msgs = {k: v - msgs_before.get(k, 0) for k, v in _nats_messages().items()}
    cpu["the_rest"] = cpu["machine"] - sum(
        v for k, v in cpu.items() if k != "machine" and not k.startswith("of_which")
    )
    outcomes = [(await h.story(i))[-1] for i in ids]
    return {
        "activations": THROUGHPUT_ACTIVATIONS,
        "seconds": round(elapsed, 2),
        "activations_per_s": round(THROUGHPUT_ACTIVATIONS / elapsed, 1),
        "sustained_per_s": _sustained([ended_at[i] for i in ids if i in ended_at]),
        "completed": outcomes.count("activation.completed"),
        "on_resident_runners": len(resident.intersection(ids)),
        "worker_concurrency": WORKER_CONCURRENCY,
        "target_per_s": 200,
        # Where an activation's CPU goes (ms per activation), to tell what bounds the rate.
        "cpu_ms_per_activation": {
            k: round(v * 1000 / THROUGHPUT_ACTIVATIONS, 1) for k, v in cpu.items()
        },
        # NATS messages per activation (each connection's in + out; the server's in and out).
        "nats_messages_per_activation": {
            k: round(v / THROUGHPUT_ACTIVATIONS, 1) for k, v in sorted(msgs.items()) if v
        },
    }


def _sustained(ended_at: list[float]) -> float | None:
    """The rate between the tenth and the ninetieth percent of the ends: the batch's start
    (the worker's slots filling) and its drain (fewer left than slots) left out — the rate a
    worker kept busy holds, where `activations_per_s` is the whole batch's."""
    ends = sorted(ended_at)
    first, last = len(ends) // 10, len(ends) * 9 // 10
    if last - first < 2 or ends[last] <= ends[first]:
        return None
    return round((last - first) / (ends[last] - ends[first]), 1)


async def _backend(
    stack: Stack, tmp: Path, name: str, pool: list[int] | None = None, *, warm: bool = False
) -> dict[str, Any]:
    started_at: dict[str, float] = {}
    resident: set[str] = set()  # started on a runner kept from the session's last one

    async def on_status(msg: Msg) -> None:
        status = PoolStatus.model_validate_json(msg.data)
        if status.kind == "started":
            started_at.setdefault(status.activation_id, time.time())
            if status.resident:
                resident.add(status.activation_id)

    sub = await stack.nc.subscribe(stack.topology.pool_status_subject("*"), cb=on_status)
    try:
        async with ScriptedModelServer(default=Reply.text("ok")) as model:
            async with harness(stack, model, tmp, factory(name, stack), name) as h:
                figures: dict[str, Any] = {"overhead": await _overhead(h)}
                figures |= await _message_to_model(
                    h, started_at if name == "pool" else None, warm=warm
                )
            if pool is None:
                return figures
            # The throughput's model costs next to nothing, as a provider's does to the
            # machine running the platform: the scripted server's web stack would add ~0.7 ms
            # of CPU an activation on these same cores.
            async with (
                NoopModelServer() as noop,
                harness(
                    stack, model, tmp / "throughput", factory(name, stack), name, model_url=noop.url
                ) as h,
            ):
                sessions = [await h.world(f"tp{i}") for i in range(THROUGHPUT_SESSIONS)]
                figures["throughput"] = await _throughput(h, pool, resident, sessions)
                figures["throughput"]["model_calls"] = noop.calls
                if warm:  # the same sessions again: each has its runner now
                    calls = noop.calls
                    again = await _throughput(h, pool, resident, sessions)
                    again["model_calls"] = noop.calls - calls
                    figures["throughput_sessions_warm"] = again
        return figures
    finally:
        await sub.unsubscribe()


async def backends(nats_url: str, pg_url: str, root: Path) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(dir=root))
    out: dict[str, Any] = {}
    # `SUZUMIO_BENCH_BACKENDS=pool_warm_sessions` (comma-separated) measures only those.
    wanted = set(filter(None, os.environ.get("SUZUMIO_BENCH_BACKENDS", "").split(","))) or {
        "process",
        "docker",
        "pool",
        "pool_warm_sessions",
    }
    async with running_stack(nats_url, pg_url, tmp, SERVICES) as stack:
        for name in ("process", "docker"):
            if name in wanted:
                out[name] = await _backend(stack, tmp / name, name)
        if "pool" in wanted:
            async with workers(stack, tmp / "cold") as procs:
                out["pool"] = await _backend(stack, tmp / "pool", "pool", [p.pid for p in procs])
        if "pool_warm_sessions" not in wanted:
            return out
        async with workers(stack, tmp / "warm", *WARM_SESSIONS) as procs:
            out["pool_warm_sessions"] = await _backend(
                stack, tmp / "pool_warm", "pool", [p.pid for p in procs], warm=True
            )
    return out
