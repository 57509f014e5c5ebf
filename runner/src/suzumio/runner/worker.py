"""`python -m suzumio.runner worker`: a long-lived worker of a pool (DESIGN.md §8).

It pulls `ActivationDispatch`es from `act.<pool>` through the pool's one durable consumer
(several workers share the work; each runs at most `concurrency` at once) and runs every one as
a sandbox of its own: `python -m suzumio.runner run input.json` in a fresh work directory, in
its own session and process group, with the dispatch's environment and nothing of the worker's.

It speaks core NATS (`Topology.pool_*`): `started`, a `heartbeat` every few seconds and
`exited` with the exit code on `pool.status.<activation>`; its presence on `pool.worker.<id>`;
what it runs and recently ended in answer to `pool.list`. `pool.cancel.<activation>` stops a
run: SIGTERM to its process group, SIGKILL after a grace.

Acks: `in_progress` keeps the message while the runner runs; it is acked only after the runner
exited, whatever the code (a runner posts its output before it exits 0; the orchestrator decides
about retries), and `exited` goes out after the ack, saying whether the server confirmed it. A
dispatch past its deadline, or cancelled, is refused (`term`) unstarted. A worker killed mid-run
never acks: its runner dies with it (parent-death signal), and the orchestrator, seeing the
heartbeats stop, declares the attempt lost, deletes the dispatch and broadcasts its cancel, so no
worker starts that attempt again. A dispatch redelivered before that — its worker died before
starting it — runs if it is still within its deadline. The broker refuses the token of an attempt
the orchestrator has ended, whatever a worker does.

Warm sessions (`--idle-ttl`): a dispatch names its session (`affinity_key`); its workspace is
then `<workdir>/<worker>/sessions/<key>` and stays after the run, for the idle TTL, so the
session's next activation on this worker finds the files, checkouts and caches the last one
left (and `/workspace/session`). The idle TTL is the worker's, or the profile's
(`idle_seconds`, carried by the dispatch) if shorter, counted from the session's last
activation here. Unless started with `--no-take-routed`, its presence beats name the sessions
it keeps warm, and the orchestrator sends a warm session's next dispatch to
`act.<pool>.worker.<id>`, which only this worker's own consumer takes (session affinity); it
pulls that one beside the pool's — even while its slots are all held, to hand it back
(`refused`, `busy`: the orchestrator sends it to the pool's queue) if none frees within
`ROUTED_HOLD_SECONDS`. A cold start elsewhere is only slower, never wrong, since the
history and checkpoint come with the input.

Limits (`suzumio.runner.limits`): each run, or a warm session's resident runner, is held to
the dispatch's profile limits — in a cgroup of its own under the worker's where the host
allows, by rlimits otherwise. A resident runner keeps the limits it was started with: an
activation with other limits gets a new runner.

Health (`--health-port`, `suzumio.runner.health`): `/healthz` while it runs and is not
stopping, `/readyz` while it can take work — NATS connected, the consumer bound, the fork
server alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import fcntl
import json
import os
import re
import secrets
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal, get_args

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.errors import APIError as JetStreamAPIError
from nats.js.errors import Error as JetStreamError
from nats.js.errors import NoStreamResponseError, NotFoundError
from nats.js.object_store import ObjectStore
from pydantic import ValidationError

from suzumio.contracts.nats_servers import nats_servers
from suzumio.contracts.runner import (
    MAX_WARM_KEYS,
    ActivationDispatch,
    FileRef,
    PoolCancel,
    PoolListRequest,
    PoolStatus,
    PoolStatusKind,
    PoolStatusReason,
    PoolWorkerInfo,
)
from suzumio.contracts.subjects import ARTIFACTS_BUCKET, Topology
from suzumio.contracts.values import ResourceLimits
from suzumio.runner import cpu, eventloop, exchange, health, heap, nats_client
from suzumio.runner import limits as sandbox_limits
from suzumio.runner.cpu import CpuPolicy
from suzumio.runner.forkserver import ForkedProcess, ForkServer, ResidentRun
from suzumio.runner.log import log, tail
from suzumio.runner.workfiles import WorkspaceError, empty, remove_tree

# The orchestrator stops a run at its deadline; the worker does too, this much later, in case
# nobody is left to do it.
DEADLINE_BACKSTOP_SECONDS = 30.0
# Ends remembered (`recent_seconds` long) at most: the oldest go first. Ten minutes of a busy
# worker's ends were held in memory, each listing serialising all of them on the loop; this
# many still outlast the pool consumer's ack wait at hundreds of ends a second.
RECENT_MAX = 20_000
# A run's ack (`_report_end`): the first try, which its end waits for, is short — the end goes
# out without it rather than wait past the orchestrator's heartbeat timeout — then it is tried
# again a few times.
FIRST_ACK_SECONDS = 1.0
ACK_SECONDS = 5.0
ACK_RETRIES = 3
# How long a dispatch from the pool's queue that found its slot taken (by one routed here) waits
# for another before it goes back to the queue.
NO_SLOT_HOLD_SECONDS = 2.0
# How long a dispatch routed here (a warm session's) waits for a slot before it is handed back
# to the orchestrator, which sends it to the pool's queue: the slots may all be held by runs
# the orchestrator had not heard of yet when it routed it here, which may last an hour.
ROUTED_HOLD_SECONDS = 5.0
# A worker's own consumer (dispatches routed to it) outlives its pulls this long: its id dies
# with its process, and a new worker makes its own.
OWN_CONSUMER_INACTIVE_SECONDS = 3600.0
# A dispatch's claim (`_claim`): how long one write of it may take, the pauses before it is
# written again (its outcome unknown: NATS slow, or this worker cut off), and how long past
# the deadline the claim outlives it (a redelivery after the deadline is refused for that
# already).
CLAIM_TIMEOUT_SECONDS = 5.0
CLAIM_PAUSES_SECONDS = (0.5, 1.0, 2.0)
CLAIM_MARGIN_SECONDS = 60.0
# How often a pull loop looks whether NATS is back, while it is away (`_fetch`).
AWAY_PAUSE_SECONDS = 0.25
WRONG_LAST_SEQUENCE = frozenset({10071, 10164})  # the server's, and the cluster's
# Runs that could not start here for a fault of this worker's own (a full disk, cgroups
# refused, its runner not starting), in a row, before it pauses its pulls from the pool's
# queue; the pause, doubled with each further fault, up to the most. A worker failing every
# run in milliseconds was always the first free: it took most of the pool's work and failed
# it, the retries too, while healthy workers sat idle.
FAULTS_BEFORE_PAUSE = 3
# Laying a run out fails for the machine (counted) with these; with others (a warm workspace an
# agent made read-only) for the session alone.
MACHINE_FAULTS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EMFILE,
                            errno.ENFILE, errno.ENOMEM})  # fmt: skip
FAULT_PAUSE_SECONDS = 5.0
FAULT_PAUSE_MAX_SECONDS = 60.0
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")  # worker ids are subject tokens
_POOL = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")  # the contracts' Slug
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
# A worker's runs' cgroups: <own cgroup>/<this><id>-<pid>-<its start time>/<run>. The process
# in the name: a worker that stops (removing its tree, and killing what is in it) while its
# successor with the same id starts must not take the successor's runs with it, and a worker
# sweeps only the trees of workers that are gone.
CGROUP_PREFIX = "suzumio-worker-"
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def default_worker_id() -> str:
    host = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:40] or "worker"
    return f"{host}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class WorkerConfig:
    nats_url: str = "nats://127.0.0.1:4222"
    namespace: str = ""
    pool: str = "default"
    concurrency: int = 1
    workdir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "suzumio-worker")
    worker_id: str = field(default_factory=default_worker_id)
    heartbeat_seconds: float = 3.0
    ack_wait_seconds: float = 30.0  # used only when this worker creates the pool's consumer
    kill_grace_seconds: float = 5.0
    drain_seconds: float = 30.0
    idle_ttl_seconds: float = 0.0  # > 0: keep a session's workspace warm this long
    max_warm: int = 8
    recent_seconds: float = 600.0  # how long ends and cancels are remembered
    sandbox_path: str = "/usr/local/bin:/usr/bin:/bin"
    warm_runners: bool = True  # fork runners from a fork server instead of starting Python
    resident_runs: int = 100  # > 0 (with warm sessions and runners): a warm session's runner
    # stays, and runs up to this many of its activations
    cpu_policy: CpuPolicy = "batch"  # the worker's, its fork server's and its runners'
    cgroups: bool = True  # a cgroup per run for its limits where the host allows; else rlimits
    health_port: int | None = None  # serve /healthz and /readyz here (0: any free port)
    health_host: str = "127.0.0.1"
    # Pull dispatches sent to this worker for the sessions it keeps warm (session affinity):
    # only with warm sessions (`idle_ttl_seconds` > 0), the only ones routed anywhere.
    take_routed: bool = True

    def __post_init__(self) -> None:
        if not _TOKEN.fullmatch(self.worker_id):
            raise ValueError(f"worker id must match {_TOKEN.pattern}: {self.worker_id!r}")
        if not _POOL.fullmatch(self.pool):
            raise ValueError(f"pool must match {_POOL.pattern}: {self.pool!r}")
        if self.health_port is not None and not 0 <= self.health_port <= 65535:
            raise ValueError(f"health port must be 0 to 65535: {self.health_port}")
        if self.cpu_policy not in get_args(CpuPolicy):
            choices = ", ".join(get_args(CpuPolicy))
            raise ValueError(f"cpu policy must be one of {choices}: {self.cpu_policy!r}")


# What became of a dispatch's claim (`Worker._claim`).
Claim = Literal["ours", "theirs", "unknown"]


@dataclass
class _Run:
    dispatch: ActivationDispatch
    msg: Msg
    root: Path  # input.json and runner.log: outside the workspace, so tools cannot read them
    workspace: Path
    warm_key: str | None  # the warm session workspace this run holds
    warm_start: bool
    spec: str = ""  # the input's JSON, for a resident runner (which gets it in its request)
    log: Path | None = None  # a resident runner's log, shared by its activations
    proc: asyncio.subprocess.Process | ForkedProcess | None = None
    stop_reason: PoolStatusReason | None = None
    started: PoolStatus | None = None
    resident: bool = False  # on a resident runner kept from an earlier activation
    # Kills at the memory limit its (resident runner's) cgroup counted before it began: the
    # count spans the runner's activations, and an earlier one's does not make this one's.
    oom_kills_before: int = 0
    own: bool = False  # taken from this worker's own consumer (routed here), not the pool's
    halted: asyncio.Event = field(default_factory=asyncio.Event)  # set at its cancel


@dataclass
class _Resident:
    """A warm session's resident runner, and the environment it was started with (less the
    activation's id): an activation with another (another agent, rotated keys) gets a new one."""

    proc: ForkedProcess
    env: dict[str, str]
    log: Path
    limits: ResourceLimits | None  # what it was held to when it started
    cgroup: str | None  # the name of its cgroup, if it has one
    runs: int = 0  # it leaves after `resident_runs`: one that has them all is not asked again


# What differs from one activation of a session to the next without making its resident
# runner unfit for it: the activation's id, and the trace its launch belongs to.
_PER_ACTIVATION = frozenset({"SUZUMIO_ACTIVATION_ID", "TRACEPARENT"})


def _resident_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in _PER_ACTIVATION}


class WarmSessions:
    """Session workspaces kept `ttl` seconds after their last run: the warm sessions.

    A dispatch with an affinity key gets the key's workspace — the files its session's last
    activation left on this worker, if it ran here within the TTL — unless another run holds it.
    """

    def __init__(self, root: Path, ttl: float, limit: int) -> None:
        self._root, self._ttl, self._limit = root, ttl, limit
        self._idle: dict[str, tuple[float, float]] = {}  # key → (last run's end, its TTL)
        self._busy: set[str] = set()

    def __len__(self) -> int:
        return len(self._idle)

    def keys(self) -> list[str]:
        """The sessions kept here, busy or idle: the busy first, then the idle newest first."""
        idle = sorted(self._idle, key=lambda k: self._idle[k][0], reverse=True)
        return [*sorted(self._busy), *idle]

    def take(self, key: str) -> tuple[Path, bool] | None:
        if self._ttl <= 0 or key in self._busy:
            return None
        path = self._root / key
        path.mkdir(parents=True, exist_ok=True)  # first: if it fails, nothing is taken
        self._busy.add(key)
        warm = self._idle.pop(key, None) is not None
        return path, warm

    def give_back(self, key: str, ttl: float | None = None) -> list[str]:
        """Keep it warm — for the worker's TTL, or `ttl` (the profile's) if shorter; returns
        the keys evicted to stay within the limit."""
        self._busy.discard(key)
        self._idle[key] = (time.monotonic(), self._ttl if ttl is None else min(ttl, self._ttl))
        evicted = sorted(self._idle, key=self._idle.__getitem__)[
            : max(len(self._idle) - self._limit, 0)
        ]
        for old in evicted:
            del self._idle[old]
        return evicted

    def expired(self) -> list[str]:
        now = time.monotonic()
        keys = [k for k, (seen, ttl) in self._idle.items() if now - seen > ttl]
        for key in keys:
            del self._idle[key]
        return keys

    def path(self, key: str) -> Path:
        return self._root / key


def _die_with_parent() -> None:  # in the child, between fork and exec
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _seconds_left(dispatch: ActivationDispatch) -> float:
    deadline = dispatch.deadline
    if deadline.tzinfo is None:
        deadline = deadline.replace(tzinfo=UTC)
    return (deadline - datetime.now(UTC)).total_seconds()


def _ids_of(data: bytes) -> tuple[str, int] | None:
    """Activation id and attempt of a dispatch this worker cannot read, to refuse it openly."""
    try:
        doc: Any = json.loads(data)
        return str(doc["input"]["activation"]["id"]), int(doc.get("attempt", 1))
    except (ValueError, TypeError, KeyError):
        return None


class Worker:
    def __init__(self, config: WorkerConfig) -> None:
        self.cfg = config
        self.topology = Topology(namespace=config.namespace)
        self.root = config.workdir / config.worker_id
        self.warm = WarmSessions(self.root / "sessions", config.idle_ttl_seconds, config.max_warm)
        self._runs: dict[str, _Run] = {}
        self._cancelled: dict[str, float] = {}  # dispatch id, or "<activation id>.*"
        self._recent: dict[str, tuple[float, PoolStatus]] = {}
        # This process among the workers ever named so (`--worker-id` is reused on restart),
        # in its claims: for whoever looks at one.
        self._instance = secrets.token_hex(8)
        self._handed_back: dict[str, float] = {}  # routed here, handed back unstarted: when
        self._tasks: set[asyncio.Task[None]] = set()  # one per dispatch in hand
        self._aux: set[asyncio.Task[None]] = set()  # kills, removals
        self._freed = asyncio.Event()  # a run ended: for the pool's pull loop
        self._own_freed = asyncio.Event()  # the same, for this worker's own consumer's loop
        self._running = 0  # runs holding one of the `concurrency` slots
        self._waiting_own = 0  # dispatches routed here waiting for a slot
        self._slot_freed = asyncio.Event()
        self._own_bound = False  # dispatches routed to this worker reach it (affinity)
        self._own_error: str | None = None
        self._nc: NATS | None = None
        self._js: JetStreamContext | None = None  # of `_nc`, made once: each run claims
        self._forks: ForkServer | None = None
        self._lock: IO[bytes] | None = None  # held while the worker lives (`_claim`)
        self._forks_lock = asyncio.Lock()
        self._residents: dict[str, _Resident] = {}  # by warm session key
        self._store: ObjectStore | None = None  # the artifacts' object store, once needed
        self._cgroups: sandbox_limits.Cgroups | None = None
        self._stop: asyncio.Event | None = None  # for the health endpoint: set once stopping
        self._pulling = False  # the pool's consumer is bound and its pull loop runs
        self._fetch_error: str | None = None  # the last pull failed (not merely timed out)
        self._faults = 0  # runs in a row that could not start for a fault of this worker's
        self._last_fault = ""

    @property
    def nc(self) -> NATS:
        assert self._nc is not None
        return self._nc

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            self._js = self.nc.jetstream()
        return self._js

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set, then drain: let runs end (or stop them) and ack them.

        Raises:
            HealthEndpointError: its address cannot be bound (before anything else).
        """
        self._stop = stop
        if self.cfg.health_port is None:
            await self._run(stop)
            return
        endpoint = health.HealthServer(self)
        await endpoint.start(self.cfg.health_host, self.cfg.health_port)
        log("worker.health_serving", host=self.cfg.health_host, port=endpoint.port)
        try:
            await self._run(stop)
        finally:
            await endpoint.close()

    def liveness(self) -> str | None:
        """Why the health endpoint's /healthz fails (None: it passes). Answered at all, the
        event loop is responsive; NATS away is for /readyz, not a reason to restart."""
        return "stopping" if self._stop is not None and self._stop.is_set() else None

    def readiness(self) -> str | None:
        """Why /readyz fails (None: this worker can take the pool's work now)."""
        if why_not := self.liveness():
            return why_not
        reasons = (
            "not connected to NATS" if self._nc is None or not self._nc.is_connected else "",
            "" if self._pulling else "the pool's consumer is not bound",
            f"pulling from the pool's consumer fails: {self._fetch_error}"
            if self._fetch_error is not None
            else "",
            "the fork server is down" if self._forks is not None and not self._forks.alive else "",
            f"{self._faults} runs in a row could not start here: {self._last_fault}"
            if self._faulty()
            else "",
        )
        return next((why for why in reasons if why), None)

    def _faulty(self) -> bool:
        return self._faults >= FAULTS_BEFORE_PAUSE

    def _fault(self, exc: BaseException) -> None:
        """A run could not start for a fault of this worker's own."""
        self._faults += 1
        self._last_fault = f"{type(exc).__name__}: {exc}"[:300]
        if self._faults == FAULTS_BEFORE_PAUSE:
            log("worker.faulty", runs=self._faults, error=self._last_fault)

    def _fault_pause(self) -> float:
        """How long to leave the pool's queue to other workers before taking one more."""
        if not self._faulty():
            return 0.0
        doubled = FAULT_PAUSE_SECONDS * 2.0 ** (self._faults - FAULTS_BEFORE_PAUSE)
        return min(doubled, FAULT_PAUSE_MAX_SECONDS)

    async def _run(self, stop: asyncio.Event) -> None:
        self._nc = await self._connect(stop)
        if self._nc is None:
            log("worker.stopped", worker=self.cfg.worker_id, reason="NATS never answered")
            return
        await asyncio.to_thread(self._find_cgroups)
        self._lock = await asyncio.to_thread(_claim, self.root)
        await asyncio.to_thread(_sweep_dead_workers, self.cfg.workdir, self.root)
        if self.cfg.warm_runners:
            self._forks = ForkServer()
            await self._forks.start()
        try:
            psub = await self._subscribe(stop)
            if psub is None:
                return
            # Bound before the first beat, so that it already says routed dispatches are
            # taken here (else nothing is routed here until the next beat).
            takes_routed = self.cfg.take_routed and self.cfg.idle_ttl_seconds > 0
            routed = await self._bind_own_or_note() if takes_routed else None
            drained = asyncio.Event()
            own = asyncio.create_task(
                self._pull_own(stop, drained, routed) if takes_routed else asyncio.sleep(0)
            )
            presence = asyncio.create_task(self._presence())
            log("worker.ready", worker=self.cfg.worker_id, pool=self.cfg.pool)
            self._pulling = True
            try:
                while not stop.is_set():
                    await self._pull_once(psub, stop, self._freed)
                    if self._fetch_error is not None:
                        psub = await self._bound_again(psub)
            finally:
                self._pulling = False
                # Said at once, not at the next beat: till an orchestrator hears it, it sends
                # the warm sessions' next dispatches here, which the drain hands back.
                self._own_bound = False
                await self._announce()
                if not stop.is_set():  # else it hands back what still comes, to the end
                    own.cancel()
                await self._drain()
                drained.set()
                with contextlib.suppress(asyncio.CancelledError):
                    await own
                presence.cancel()
                with contextlib.suppress(Exception):
                    await psub.unsubscribe()
        finally:
            if self._forks is not None:
                await self._forks.close()
            if self._cgroups is not None:
                await asyncio.to_thread(self._cgroups.close)
            with contextlib.suppress(Exception):
                await self.nc.close()  # what must reach the server was flushed already
            # All of it, though an agent made directories read-only (`go build` does): the
            # next worker has another id, and nobody would remove what is left here.
            await asyncio.to_thread(remove_tree, self.root)
            if self._lock is not None:
                self._lock.close()
            log("worker.stopped", worker=self.cfg.worker_id)

    def _find_cgroups(self) -> None:
        """The host's cgroups for the runs, if it allows them; which profile limits cannot be
        held here is said once, at the start."""
        name = f"{CGROUP_PREFIX}{self.cfg.worker_id}-{os.getpid()}-{_started(os.getpid())}"
        found = sandbox_limits.discover(name) if self.cfg.cgroups else "turned off (--no-cgroups)"
        if isinstance(found, sandbox_limits.Cgroups):
            self._cgroups = found
            found.sweep_siblings(CGROUP_PREFIX, _tree_alive)  # workers killed before cleanup
            enforcement = found.enforcement
        else:
            enforcement = sandbox_limits.rlimit_enforcement(found)
        event = "worker.limits_unenforced" if enforcement.unenforced else "worker.limits"
        log(event, worker=self.cfg.worker_id, **enforcement.detail())

    def _sandbox(self, name: str, limits: ResourceLimits | None) -> sandbox_limits.Sandbox:
        """What a runner applies to itself first: its cgroup (`name`, made now) and rlimits;
        nothing for a dispatch that brought no limits.

        Raises:
            OSError: the cgroup could not be made (the run does not start without it).
        """
        if limits is None:
            return sandbox_limits.Sandbox()
        if self._cgroups is None:
            return sandbox_limits.Sandbox(rlimits=sandbox_limits.rlimits(limits, contained=False))
        return self._cgroups.create(name, limits)

    async def _killed_for_memory(self, run: _Run, code: int) -> bool:
        """The runner was SIGKILLed and its cgroup counts a kill at its memory limit."""
        if self._cgroups is None or code not in {-signal.SIGKILL, 128 + signal.SIGKILL}:
            return False
        if run.spec:  # on a resident runner: its cgroup is the runner's
            resident = self._residents.get(run.warm_key or "")
            name = resident.cgroup if resident is not None else None
        else:
            name = _run_cgroup(run)
        if name is None:
            return False
        return await asyncio.to_thread(self._cgroups.oom_kills, name) > run.oom_kills_before

    def _drop_cgroup(self, name: str) -> None:
        """Empty and remove a run's cgroup, in the background (it waits for the kills)."""
        if self._cgroups is not None:
            self._background(asyncio.to_thread(self._cgroups.remove, name))

    async def _connect(self, stop: asyncio.Event) -> NATS | None:
        """NATS, waited for as long as it takes, but not past a stop: a worker started before
        its NATS (or while it is away) still ends on SIGTERM. None: stopped first. Each failed
        attempt is one line of the worker's log (nats-py's own would be a traceback)."""

        async def on_error(exc: Exception) -> None:
            log("worker.nats_error", error=str(exc) or type(exc).__name__)

        async def on_disconnected() -> None:
            log("worker.nats_disconnected")

        async def on_reconnected() -> None:
            log("worker.nats_reconnected")

        servers, credentials = nats_servers(self.cfg.nats_url)
        connecting = asyncio.ensure_future(
            nats_client.connect(
                servers=servers,
                name=f"suzumio-worker-{self.cfg.worker_id}",
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                error_cb=on_error,
                disconnected_cb=on_disconnected,
                reconnected_cb=on_reconnected,
                **credentials,
            )
        )
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not connecting.done():
            connecting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            return await connecting
        return None

    async def _subscribe(self, stop: asyncio.Event) -> JetStreamContext.PullSubscription | None:
        js = self.nc.jetstream()
        stream, durable = (
            self.topology.activations_stream,
            self.topology.pool_consumer(self.cfg.pool),
        )
        while not stop.is_set():
            try:
                await self._ensure_consumer(js, stream, durable)
                break
            except (JetStreamError, TimeoutError, NatsTimeoutError) as exc:
                log("worker.waiting_for_stream", stream=stream, error=repr(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
        else:
            return None
        await self.nc.subscribe(self.topology.pool_cancel_filter(), cb=self._on_cancel)
        await self.nc.subscribe(self.topology.pool_list_subject(), cb=self._on_list)
        return await js.pull_subscribe_bind(durable, stream=stream)

    async def _bound_again(
        self, psub: JetStreamContext.PullSubscription
    ) -> JetStreamContext.PullSubscription:
        """After a failed pull: the pool's consumer made again if it is gone (deleted by an
        operator, its stream made again), and bound anew — else every pull failed, once a
        second, for as long as the worker lived, and the pool sat idle. `psub` as it was when
        the consumer is there, or cannot be looked at now."""
        if not self.nc.is_connected:  # asked now, the look would wait for the reconnect
            return psub
        js = self.js
        stream, durable = (
            self.topology.activations_stream,
            self.topology.pool_consumer(self.cfg.pool),
        )
        try:
            await js.consumer_info(stream, durable)
        except NotFoundError:
            pass
        except Exception:
            return psub  # NATS away, or a leader being elected: the next pull tells
        else:
            return psub
        log("worker.pool_consumer_gone", consumer=durable)
        try:
            await self._ensure_consumer(js, stream, durable)
            bound = await js.pull_subscribe_bind(durable, stream=stream)
        except Exception as exc:
            log("worker.pool_consumer_failed", error=repr(exc))
            return psub
        with contextlib.suppress(Exception):
            await psub.unsubscribe()
        return bound

    async def _pull_own(
        self,
        stop: asyncio.Event,
        drained: asyncio.Event,
        psub: JetStreamContext.PullSubscription | None,
    ) -> None:
        """Pull the dispatches routed to this worker (its warm sessions' next activations) from
        its own consumer (`psub`, if bound already), beside the pool's loop; the same slots.
        Made again after an error (its consumer may have gone, idle past its inactivity
        threshold while NATS was away). Until it is bound, beats name no warm session, so
        nothing is routed here. Stopping, it goes on until the drain is over, handing back
        (`busy`) what an orchestrator sent before it heard: left in this worker's consumer,
        which nobody pulls any more, each waited for the worker to be gone, then was lost."""
        while not drained.is_set():
            if psub is None:
                if stop.is_set():
                    break  # nothing is routed to a worker not bound
                psub = await self._bind_own_or_note()
                if psub is None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 1.0)
                    continue
            await self._pull_once(psub, stop, self._own_freed, own=True)
            if self._own_error is not None:
                self._own_bound = False
                with contextlib.suppress(Exception):
                    await psub.unsubscribe()
                psub = None
        self._own_bound = False
        if psub is not None:
            with contextlib.suppress(Exception):
                await psub.unsubscribe()

    async def _bind_own_or_note(self) -> JetStreamContext.PullSubscription | None:
        """This worker's own consumer, bound; None (and why, for health) if it could not be."""
        try:
            psub = await self._bind_own()
        except Exception as exc:
            self._own_error = repr(exc)
            log("worker.own_consumer_failed", error=repr(exc))
            return None
        # Not once stopping: the stop said at once it takes no routed dispatches (a bind
        # that was under way then must not say otherwise in the drain's beats).
        self._own_bound, self._own_error = not self._stopping(), None
        return psub

    async def _bind_own(self) -> JetStreamContext.PullSubscription:
        """This worker's consumer of `act.<pool>.worker.<id>`: the pool consumer's ack wait
        and deliveries, and gone an hour after the worker stopped pulling (its id dies with
        its process). What was routed to a worker that died stays in the stream: the
        orchestrator sees the worker gone and ends that attempt as lost."""
        js = self.nc.jetstream()
        stream = self.topology.activations_stream
        pool = await js.consumer_info(stream, self.topology.pool_consumer(self.cfg.pool))
        durable = self.topology.worker_consumer(self.cfg.pool, self.cfg.worker_id)
        await js.add_consumer(
            stream,
            ConsumerConfig(
                durable_name=durable,
                filter_subject=self.topology.worker_activation_subject(
                    self.cfg.pool, self.cfg.worker_id
                ),
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=pool.config.ack_wait,
                max_deliver=pool.config.max_deliver,
                max_ack_pending=self.cfg.concurrency * 4,
                deliver_policy=DeliverPolicy.ALL,
                inactive_threshold=OWN_CONSUMER_INACTIVE_SECONDS,
            ),
        )
        return await js.pull_subscribe_bind(durable, stream=stream)

    async def _ensure_consumer(self, js: JetStreamContext, stream: str, durable: str) -> None:
        """Create the pool's consumer if nobody has; the orchestrator's settings win after."""
        with contextlib.suppress(JetStreamError):
            await js.consumer_info(stream, durable)
            return
        config = ConsumerConfig(
            durable_name=durable,
            filter_subject=self.topology.activation_subject(self.cfg.pool),
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.cfg.ack_wait_seconds,
            max_deliver=5,
            max_ack_pending=10_000,
            deliver_policy=DeliverPolicy.ALL,
        )
        try:
            await js.add_consumer(stream, config)
        except JetStreamError:
            await js.consumer_info(stream, durable)  # created by someone else meanwhile

    async def _pull_once(
        self,
        psub: JetStreamContext.PullSubscription,
        stop: asyncio.Event,
        freed: asyncio.Event,
        *,
        own: bool = False,
    ) -> None:
        # Both loops (the pool's and this worker's own) may fetch while one slot is free: of
        # two dispatches taken for it, each waits in `_handle` for a slot a while, then one
        # from the pool's queue goes back to it (nak), one sent here is handed back to the
        # orchestrator (`busy`) — neither runs beside the others. One sent here is taken
        # even while every slot is held (by runs the orchestrator had not heard of when it
        # routed it here): left in the queue, it would wait there for a run to end.
        free = self.cfg.concurrency - len(self._tasks)
        if free <= 0 and not (own and self._waiting_own < self.cfg.concurrency):
            freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(freed.wait(), 1.0)
            return
        if not own and (pause := self._fault_pause()) > 0:
            # Its runs keep failing here: the pool's queue is left to other workers for a
            # while, then one dispatch is taken — the try that tells whether it healed.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), pause)
            if not stop.is_set():
                await self._take(await self._fetch(psub, 1, 1.0, own=own), stop, own=own)
            return
        # One at a time while waiting: nats-py's fetch of a batch waits for the whole batch
        # (or the timeout) once its first message came, which would hold that message back.
        msgs = await self._fetch(psub, 1, 1.0, own=own)
        if not await self._take(msgs, stop, own=own):
            return
        # And then whatever else was queued behind it — only if something was: a fetch of a
        # batch from an empty queue lingers (until its timeout, or a whole batch), and would
        # hold back a dispatch that came meanwhile.
        queued = msgs[-1].metadata.num_pending
        if free > 1 and queued > 0:
            more = await self._fetch(psub, min(free - 1, queued), 0.05, own=own)
            await self._take(more, stop, own=own)

    async def _fetch(
        self, psub: JetStreamContext.PullSubscription, batch: int, timeout: float, *, own: bool
    ) -> list[Msg]:
        """What the queue hands out; nothing on a timeout or an error (NATS away, a 503 or
        a leader's change in a cluster: nats-py raises those), which must not end the
        worker's loop — the next round asks again. Nothing is asked while the connection is
        away: nats-py buffers the request, and sends it at the reconnect with every other
        one asked meanwhile (one a second) — the queue then handed this worker that many
        dispatches at once, more than its slots, held unstarted past their ack wait and
        handed out again (a delivery each, towards their `max_deliver`)."""
        if self._nc is not None and not self._nc.is_connected:
            await asyncio.sleep(min(timeout, AWAY_PAUSE_SECONDS))
            return []
        try:
            msgs = await psub.fetch(batch, timeout=timeout)
        except (TimeoutError, NatsTimeoutError):
            if not own:
                self._fetch_error = None  # an empty queue, or NATS away (which /readyz sees)
            return []
        except Exception as exc:
            if own:
                self._own_error = type(exc).__name__
            else:
                self._fetch_error = type(exc).__name__
            log("worker.fetch_failed", error=repr(exc), own=own)
            await asyncio.sleep(1.0)
            return []
        if not own:
            self._fetch_error = None
        return msgs

    async def _take(self, msgs: list[Msg], stop: asyncio.Event, *, own: bool) -> bool:
        """Run each dispatch (whether any came) — unless the worker was told to stop while
        the fetch waited: then each goes back to the queue at once, for another worker, not
        started here only to be stopped by the drain (nor held until its ack wait passes)."""
        if stop.is_set():
            for msg in msgs:
                await self._decline(msg, own=own)
            return False
        for msg in msgs:
            task = asyncio.create_task(self._handle(msg, own=own))
            self._tasks.add(task)
            task.add_done_callback(self._done)
        return bool(msgs)

    async def _decline(self, msg: Msg, *, own: bool) -> None:
        """A dispatch fetched as the worker began to stop: back for another worker — unless
        it is a copy of one this worker runs or ran (redelivered), which its run answers for:
        handed back `busy`, the orchestrator took the word of the run's own worker for its
        end, and cancelled the healthy run."""
        try:
            dispatch: ActivationDispatch | None = ActivationDispatch.model_validate_json(msg.data)
        except ValidationError:
            dispatch = None
        if dispatch is not None and await self._seen_before(dispatch.dispatch_id, msg, own=own):
            return
        if own and dispatch is not None:  # only this worker takes those: to the orchestrator
            await self._hand_back(dispatch, msg)
            return
        with contextlib.suppress(Exception):
            await msg.nak()

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._freed.set()
        self._own_freed.set()
        if not task.cancelled() and task.exception() is not None:
            log("worker.run_crashed", error=repr(task.exception()))

    # -- one dispatch ------------------------------------------------------------------------
    async def _handle(self, msg: Msg, *, own: bool = False) -> None:
        try:
            dispatch = ActivationDispatch.model_validate_json(msg.data)
        except ValidationError:
            await self._refuse_unreadable(msg)
            return
        did = dispatch.dispatch_id
        if msg.metadata.num_delivered > 1:
            log("worker.redelivered", dispatch=did, deliveries=msg.metadata.num_delivered)
        if await self._seen_before(did, msg, own=own):
            return
        if not await self._slot(ROUTED_HOLD_SECONDS if own else NO_SLOT_HOLD_SECONDS, own=own):
            if own:
                await self._hand_back(dispatch, msg)
                return
            # Its last slot went to a dispatch sent to this worker while this one was being
            # fetched from the pool's queue, and no run ended since: back to the queue, for a
            # worker with a slot free, rather than held here until a run ends (which may take
            # an hour). Not at once: a nak counts as a delivery, and a dispatch nak'd at every
            # slot freed on a busy worker reached the consumer's max_deliver within 150 ms —
            # never to be delivered again.
            log("worker.no_slot_left", dispatch=did)
            with contextlib.suppress(Exception):
                await msg.nak()
            return
        try:
            if self._stopping():
                # The worker began to stop while this one waited for its slot: back it goes,
                # for another worker, rather than be started here only for the drain to stop
                # it (or the fork server to close under it).
                await self._give_back(dispatch, msg, own=own)
                return
            await self._handle_in_slot(dispatch, msg, own=own)
        finally:
            self._running -= 1
            self._slot_freed.set()

    async def _seen_before(self, did: str, msg: Msg, *, own: bool) -> bool:
        """A dispatch delivered again that this worker has had: not to be run here (again)."""
        if did in self._runs:
            return True  # redelivered while this worker runs it: that run acks the message
        if did in self._recent:  # it ran here and ended, but its ack was lost: never again
            log("worker.ended_already", dispatch=did)
            await self._report_end(msg, self._recent[did][1])
            return True
        if own and did in self._handed_back:  # its term was lost: it runs elsewhere now
            with contextlib.suppress(Exception):
                await msg.term()
            return True
        return False

    def _stopping(self) -> bool:
        return self._stop is not None and self._stop.is_set()

    async def _give_back(self, dispatch: ActivationDispatch, msg: Msg, *, own: bool) -> None:
        """A dispatch not started here because the worker stops, for another worker: one of
        the pool's queue back to it, one routed here handed back."""
        if own:
            await self._hand_back(dispatch, msg)
            return
        log("worker.handed_back", dispatch=dispatch.dispatch_id)
        with contextlib.suppress(Exception):
            await msg.nak()

    async def _hand_back(self, dispatch: ActivationDispatch, msg: Msg) -> None:
        """A dispatch routed here that cannot start here (no slot came free in time, or the
        worker stops): out of this worker's own consumer — only this worker would ever take it
        there — and `busy` to the orchestrator, which sends it to the pool's queue. Taken out
        first: said `busy` while still here, a redelivery could start it beside its copy."""
        did = dispatch.dispatch_id
        self._handed_back[did] = time.monotonic()
        log("worker.handed_back", dispatch=did, routed=True)
        with contextlib.suppress(Exception):
            await msg.term()
        await self._publish(self._status(dispatch, "refused", reason="busy"), flush=True)

    async def _slot(self, within: float, *, own: bool) -> bool:
        """One of the `concurrency` slots, waited for when the pool's and the own consumer's
        loops both took a dispatch for the last one, or one was sent here while all were held:
        for `within` seconds at most (False if none freed; the ack wait of both consumers is
        far longer)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        if own:
            self._waiting_own += 1
        try:
            while self._running >= self.cfg.concurrency:
                wait = deadline - loop.time()
                if wait <= 0:
                    return False
                self._slot_freed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._slot_freed.wait(), wait)
        finally:
            if own:
                self._waiting_own -= 1
        self._running += 1
        return True

    async def _handle_in_slot(
        self, dispatch: ActivationDispatch, msg: Msg, *, own: bool = False
    ) -> None:
        did = dispatch.dispatch_id
        if did in self._runs:  # redelivered while it waited for its slot: that one runs it
            return
        refusal = self._refusal(dispatch)
        if refusal is not None:
            log("worker.refused", dispatch=did, reason=refusal)
            await self._publish(self._status(dispatch, "refused", reason=refusal), flush=True)
            await msg.term()
            return
        try:
            run = self._prepare(dispatch, msg)
        except OSError as exc:  # a full disk, say: this attempt failed, the worker goes on
            if exc.errno in MACHINE_FAULTS:  # not a session's warm workspace an agent locked
                self._fault(exc)
            status = self._status(dispatch, "exited", reason="spawn_failed", detail=str(exc))
            await self._report_end(msg, status)
            return
        run.own = own
        self._runs[did] = run
        try:
            await self._execute(run)
        finally:
            del self._runs[did]
            await self._release(run)

    def _refusal(self, dispatch: ActivationDispatch) -> PoolStatusReason | None:
        if _seconds_left(dispatch) <= 0:
            return "deadline"
        any_of_it = f"{dispatch.input.activation.id}.*"
        if dispatch.dispatch_id in self._cancelled or any_of_it in self._cancelled:
            return "cancelled"
        return None

    async def _claim(self, run: _Run) -> Claim:
        """Claim the dispatch before it starts: `theirs` if a worker started it before.

        Its message stays in the queue until its run ended, and the queue hands it out again
        if no ack comes within the ack wait — after its worker died mid-run, and no leading
        orchestrator took it out of the queue in time (there was none for a while, or it
        died with the worker). Run again, the attempt would do its work twice with a token
        still good. The claim is a message on the dispatch's own subject of `CLAIMS`, written
        only where there is none (and kept to the deadline): the second worker's is refused.

        A write whose outcome is unknown is written again: a worker cut off from NATS is the
        very one whose dispatch the queue hands to another worker after the ack wait, and
        started unclaimed it ran beside that worker's run. The claim found there is then
        read: this process's own (a write that got through, its answer lost) is `ours`.
        Still unknown after the tries: `unknown`, not started here. Nothing is written while
        the connection is away (nats-py would send it at the reconnect, after the dispatch
        was given back: the next worker then found it claimed, and the attempt was lost).
        A platform from before the stream (no stream answers any try, and the stream is not
        there) runs it unclaimed, as before."""
        dispatch = run.dispatch
        value = f"{self.cfg.worker_id} {self._instance}".encode()
        subject = self.topology.claim_subject(dispatch.dispatch_id)
        no_stream = True
        for pause in (0.0, *CLAIM_PAUSES_SECONDS):
            if pause:
                if run.stop_reason is not None or self._stopping():
                    return "unknown"
                await asyncio.sleep(pause)
            if not self.nc.is_connected:
                no_stream = False
                continue
            try:
                await self.js.publish(
                    subject,
                    value,
                    timeout=CLAIM_TIMEOUT_SECONDS,
                    headers={"Nats-Expected-Last-Subject-Sequence": "0"},
                    msg_ttl=max(_seconds_left(dispatch), 0) + CLAIM_MARGIN_SECONDS,
                )
            except JetStreamAPIError as exc:
                if exc.err_code in WRONG_LAST_SEQUENCE:
                    return await self._whose_claim(subject, value)
                no_stream = False
                log("worker.claim_unknown", dispatch=dispatch.dispatch_id, error=repr(exc))
            except NoStreamResponseError as exc:
                log("worker.claim_unknown", dispatch=dispatch.dispatch_id, error=repr(exc))
            except Exception as exc:
                no_stream = False
                log("worker.claim_unknown", dispatch=dispatch.dispatch_id, error=repr(exc))
            else:
                return "ours"
        # No responders at every try: no stream — or, on a cluster, one electing its leader
        # (or out of this worker's reach), which only a look at the stream tells apart.
        return "ours" if no_stream and not await self._claims_stream_there() else "unknown"

    async def _whose_claim(self, subject: str, value: bytes) -> Claim:
        """The claim found on `subject`: this process's own, another's, or `unknown` if it
        cannot be read now."""
        try:
            found = await self.js.get_last_msg(self.topology.claims_stream, subject)
        except Exception as exc:
            log("worker.claim_unread", subject=subject, error=repr(exc))
            return "unknown"
        return "ours" if found.data == value else "theirs"

    async def _claims_stream_there(self) -> bool:
        """Whether `CLAIMS` exists (True when that cannot be told: the claim stays unknown)."""
        try:
            await self.js.stream_info(self.topology.claims_stream)
        except NotFoundError:
            return False
        except Exception as exc:
            log("worker.claims_stream_unknown", error=repr(exc))
        return True

    async def _refuse_unreadable(self, msg: Msg) -> None:
        log("worker.invalid_dispatch", seq=msg.metadata.sequence.stream)
        ids = _ids_of(msg.data)
        if ids is not None:
            status = PoolStatus(
                kind="refused",
                dispatch_id=f"{ids[0]}.{ids[1]}",
                activation_id=ids[0],
                attempt=max(ids[1], 1),
                worker_id=self.cfg.worker_id,
                pool=self.cfg.pool,
                at=datetime.now(UTC),
                reason="invalid",
            )
            with contextlib.suppress(ValidationError):
                await self._publish(status, flush=True)
        await msg.term()

    def _prepare(self, dispatch: ActivationDispatch, msg: Msg) -> _Run:
        """The run's directories and input. A run for a resident runner needs no directory of
        its own: its input goes in the request, its log is the runner's."""
        root = self.root / "runs" / dispatch.dispatch_id
        remove_tree(root)  # left by an earlier delivery
        self._expire_warm()  # a session idle past its TTL starts cold, even between sweeps
        taken = self.warm.take(dispatch.affinity_key) if dispatch.affinity_key else None
        if taken is None:
            workspace, warm_start, key = root / "workspace", False, None
            workspace.mkdir(parents=True)
        else:
            (workspace, warm_start), key = taken, dispatch.affinity_key
        try:
            try:
                return self._lay_out(dispatch, msg, root, workspace, key, warm_start=warm_start)
            except OSError as exc:
                if key is None or not warm_start or exc.errno in MACHINE_FAULTS:
                    raise
                # The session's warm workspace cannot take the run (an agent made it
                # read-only): it starts afresh, its runner too, as when its inputs cannot be
                # laid in it. Given back as it was, every next activation of the session
                # came back to it here, and failed the same way.
                log("worker.warm_workspace_reset", dispatch=dispatch.dispatch_id,
                    error=str(exc)[:300])  # fmt: skip
                self._retire(key)
                self._discard(workspace)
                workspace.mkdir(parents=True)
                return self._lay_out(dispatch, msg, root, workspace, key, warm_start=False)
        except OSError:
            if key is not None:  # else the session's workspace would stay taken for good
                for gone in self.warm.give_back(key, dispatch.idle_seconds):
                    self._retire(gone)
                    self._discard(self.warm.path(gone))
            raise

    def _lay_out(
        self,
        dispatch: ActivationDispatch,
        msg: Msg,
        root: Path,
        workspace: Path,
        key: str | None,
        warm_start: bool,
    ) -> _Run:
        if dispatch.max_output_files > 0:  # where the activation leaves its files
            with contextlib.suppress(FileExistsError):
                (workspace / "out").mkdir()
        spec = dispatch.input.model_copy(update={"workspace": str(workspace)}).model_dump_json()
        run = _Run(dispatch, msg, root, workspace, key, warm_start)
        if self._resident_for(run):
            run.spec = spec
            return run
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root / "input.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:  # UTF-8, as the runner reads it: not the locale's
            f.write(spec.encode())
        return run

    def _resident_for(self, run: _Run) -> bool:
        return self._forks is not None and run.warm_key is not None and self.cfg.resident_runs > 0

    async def _execute(self, run: _Run) -> None:
        dispatch = run.dispatch
        # Bringing the files in may take longer than the consumer's ack wait: the dispatch is
        # held meanwhile, or the queue would hand it to another worker too.
        holding = asyncio.create_task(self._beat(run, heard=False))
        try:
            if dispatch.inputs:
                await self._bring_in_unless_halted(run)
            if run.stop_reason is None and self._stopping():
                # The worker began to stop while the files came in: unclaimed, the dispatch
                # goes back for another worker — not started here for the drain to stop it,
                # nor held in a copy the drain does not wait for.
                await self._give_back(dispatch, run.msg, own=run.own)
                return
            # Claimed last thing before it starts: a worker that died before (bringing its
            # files in, say) ran nothing of it, and the queue's next worker may run it.
            claim = await self._claim(run)
            if claim == "theirs":
                log("worker.refused", dispatch=dispatch.dispatch_id, reason="claimed")
                refused = self._status(dispatch, "refused", reason="claimed")
                await self._publish(refused, flush=True)
                await run.msg.term()
                return
            if claim == "unknown" and run.stop_reason is None:
                # For another worker, or this one once NATS answers. (Cancelled meanwhile, it
                # ends below as stopped before its runner started: it never ran.)
                await self._give_back(dispatch, run.msg, own=run.own)
                return
            if (stopped := run.stop_reason) is not None:  # cancelled while it was made ready
                detail = "stopped before its runner started"
                ended = self._status(dispatch, "exited", reason=stopped, detail=detail)
                await self._finish(run, ended)
                return
            run.proc = await self._spawn_counted(run)
        # Any NATS failure too (closed, draining, a full buffer: no JetStream API errors),
        # or the run's task would die with neither an end reported nor an ack; and a child
        # that could not take its limits before exec (`SubprocessError`, no `OSError`).
        except (
            OSError,
            subprocess.SubprocessError,
            exchange.ExchangeError,
            NatsError,
            TimeoutError,
        ) as exc:
            await self._finish(
                run, self._status(dispatch, "exited", reason="spawn_failed", detail=str(exc))
            )
            return
        finally:
            holding.cancel()
        run.started = self._status(
            dispatch,
            "started",
            warm=run.warm_start,
            resident=run.resident,
            deadline=dispatch.deadline,
        )
        await self._publish(run.started)
        log("worker.started", dispatch=dispatch.dispatch_id, warm=run.warm_start,
            resident=run.resident)  # fmt: skip
        if run.stop_reason is not None:  # cancelled while it was being prepared
            self._background(self._kill(run, run.stop_reason))
        beats = asyncio.create_task(self._beat(run))
        try:
            code = await self._wait(run)
            if await self._killed_for_memory(run, code):  # before a retired runner's cgroup goes
                run.stop_reason = run.stop_reason or "oom"
            detail = self._detail(run) if code != 0 else ""  # before a retired runner's log goes
            if run.warm_key is not None and (run.stop_reason is not None or code < 0):
                self._retire(run.warm_key)  # stopped mid-way: its runner starts afresh
            outputs = await self._bring_out(run)  # still beating: uploads may take a while
        finally:
            beats.cancel()
        status = self._exit_status(run, code, outputs, detail)
        # Its session is kept warm before the end is told: the orchestrator may send the
        # session's next dispatch the moment it hears, and one that came while the session
        # still read busy here ran cold, on a new runner, beside the idle resident one.
        self._give_back_warm(run)
        await self._finish(run, status)

    async def _bring_in_unless_halted(self, run: _Run) -> None:
        """The dispatch's inputs brought in, or given up at its cancel or when the worker
        begins to stop (`run.stop_reason` or the stop says which): a large input's copy held
        either for as long as it took."""
        bringing = asyncio.create_task(self._bring_in(run))
        halts = [asyncio.create_task(run.halted.wait())]
        if self._stop is not None:
            halts.append(asyncio.create_task(self._stop.wait()))
        try:
            await asyncio.wait({bringing, *halts}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (bringing, *halts):
                waiter.cancel()
            await asyncio.wait({bringing})  # its partial file gone before the run goes on
        if not bringing.cancelled():
            bringing.result()

    async def _bring_in(self, run: _Run) -> None:
        """The dispatch's inputs into the workspace. A session's warm workspace that cannot
        take them (an earlier activation left a directory where a file goes, or a link on the
        way) starts afresh, its runner too: else each of the session's next activations here
        would fail the same way.

        Raises:
            ExchangeError: a fresh workspace cannot take them either.
        """
        store = await self._objects()
        try:
            await exchange.bring_in(store, run.workspace / "in", run.dispatch.inputs)
        except WorkspaceError as exc:  # the store's failures are not the workspace's fault
            if run.warm_key is None:
                raise
            log("worker.warm_workspace_reset", dispatch=run.dispatch.dispatch_id,
                error=str(exc)[:300])  # fmt: skip
            self._retire(run.warm_key)
            self._discard(run.workspace)
            run.workspace.mkdir(parents=True)
            if run.dispatch.max_output_files > 0:
                (run.workspace / "out").mkdir()
            run.warm_start = False
            await exchange.bring_in(store, run.workspace / "in", run.dispatch.inputs)

    async def _bring_out(self, run: _Run) -> tuple[FileRef, ...]:
        """What the activation left in `/workspace/out`, stored (an exit is reported with
        whatever could be: the files are the activation's, not its outcome)."""
        dispatch = run.dispatch
        if dispatch.max_output_files <= 0:
            return ()
        outbox = run.workspace / "out"
        try:
            store = await self._objects()
            return await exchange.bring_out(
                store, outbox, dispatch.max_output_files, dispatch.max_output_bytes
            )
        except Exception as exc:  # whatever the agent did to `out/`, the run's end is reported
            log("worker.outputs_unstored", dispatch=dispatch.dispatch_id, error=repr(exc)[:300])
            # Emptied all the same: a warm session's next activation would hand these files
            # in as its own output.
            with contextlib.suppress(Exception):
                await asyncio.to_thread(empty, outbox)
            return ()

    async def _objects(self) -> ObjectStore:
        if self._store is None:
            bucket = self.topology.bucket(ARTIFACTS_BUCKET)
            self._store = await self.nc.jetstream().object_store(bucket)
        return self._store

    async def _spawn_counted(self, run: _Run) -> asyncio.subprocess.Process | ForkedProcess:
        """`_spawn`, a failure counted as this worker's own fault (its sandbox or its runner
        would not start), a start ending the count."""
        try:
            proc = await self._spawn(run)
        except (OSError, subprocess.SubprocessError) as exc:
            if not isinstance(exc, TimeoutError):
                self._fault(exc)
            raise
        self._faults = 0
        return proc

    async def _spawn(self, run: _Run) -> asyncio.subprocess.Process | ForkedProcess:
        env = {
            "PATH": self.cfg.sandbox_path,
            "LANG": "C.UTF-8",
            "HOME": str(run.workspace),
            **run.dispatch.env,
        }
        forks = await self._fork_server()
        sandbox = sandbox_limits.Sandbox()  # a resident runner has its own (`_run_resident`)
        if not run.spec:
            limits = run.dispatch.limits
            sandbox = await asyncio.to_thread(self._sandbox, _run_cgroup(run), limits)
        if forks is not None:
            try:
                return await self._fork(forks, run, env, sandbox)
            except OSError:
                if forks.alive:
                    raise
            # It died under this start (before the worker saw it go): once more, on a new one.
            forks = await self._fork_server()
            assert forks is not None
            return await self._fork(forks, run, env, sandbox)

        def become_sandbox() -> None:  # in the child, between fork and exec
            _die_with_parent()
            sandbox.apply()

        with (run.root / "runner.log").open("ab") as out:
            return await asyncio.create_subprocess_exec(
                sys.executable,
                *("-m", "suzumio.runner", "run", str(run.root / "input.json")),
                cwd=run.workspace,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                preexec_fn=become_sandbox,
            )

    async def _fork(
        self, forks: ForkServer, run: _Run, env: dict[str, str], sandbox: sandbox_limits.Sandbox
    ) -> ForkedProcess:
        if run.warm_key is not None and run.spec:
            return await self._run_resident(forks, run, run.warm_key, env)
        return await forks.spawn(
            run.root / "input.json", run.workspace, run.root / "runner.log", env, sandbox
        )

    async def _fork_server(self) -> ForkServer | None:
        """The fork server — started again if it died, else every run after would fail to
        start while this worker went on taking the pool's work. Its resident runners died
        with it (parent-death signal): their sessions start afresh."""
        async with self._forks_lock:
            if self._forks is None or self._forks.alive:
                return self._forks
            log("worker.forkserver_restarted", worker=self.cfg.worker_id)
            await self._forks.close()
            for key in list(self._residents):
                self._retire(key)
            self._forks = ForkServer()
            await self._forks.start()
            return self._forks

    async def _revive_fork_server(self) -> None:
        try:
            await self._fork_server()
        except Exception as exc:  # the next heartbeat, or activation, tries again
            log("worker.forkserver_failed", error=repr(exc)[:300])

    async def _run_resident(
        self, forks: ForkServer, run: _Run, key: str, env: dict[str, str]
    ) -> ForkedProcess:
        """The activation on its warm session's resident runner (started if there is none,
        or none for this environment)."""
        limits = run.dispatch.limits
        resident = self._residents.get(key)
        if resident is not None and (
            resident.proc.returncode is not None
            or resident.runs >= self.cfg.resident_runs
            or resident.env != _resident_env(env)
            # Limits are set once, as the runner starts (an rlimit cannot be raised again):
            # a profile changed between two activations gets a runner held to the new ones.
            or resident.limits != limits
        ):
            self._retire(key)
            resident = None
        run.resident = resident is not None
        if resident is None:
            token = secrets.token_hex(8)
            log_path = self.root / "residents" / f"{token}.log"
            log_path.parent.mkdir(exist_ok=True)
            cgroup = f"resident-{token}"
            sandbox = await asyncio.to_thread(self._sandbox, cgroup, limits)
            try:
                proc = await forks.spawn_resident(
                    run.workspace, log_path, env, self.cfg.resident_runs, sandbox
                )
            except BaseException:  # a fork server slow to answer too: its cgroup is no run's
                self._drop_cgroup(cgroup)
                with contextlib.suppress(OSError):
                    log_path.unlink()
                raise
            resident = self._residents[key] = _Resident(
                proc, _resident_env(env), log_path, limits, cgroup if sandbox.procs else None
            )
        resident.runs += 1
        run.log = resident.log
        if resident.cgroup is not None and self._cgroups is not None:
            # A counter of cgroupfs, read at once (no disk behind it).
            run.oom_kills_before = self._cgroups.oom_kills(resident.cgroup)
        return await forks.run_in(resident.proc, run.spec, run.workspace, env)

    def _retire(self, key: str) -> None:
        """Stop a warm session's resident runner (idle, or stopped already)."""
        resident = self._residents.pop(key, None)
        if resident is None:
            return
        if resident.proc.returncode is None:
            _signal_group(resident.proc.pid, signal.SIGKILL)
        if resident.cgroup is not None:  # and whatever its commands left running
            self._drop_cgroup(resident.cgroup)
        with contextlib.suppress(OSError):
            resident.log.unlink()

    async def _wait(self, run: _Run) -> int:
        assert run.proc is not None
        try:
            left = _seconds_left(run.dispatch) + DEADLINE_BACKSTOP_SECONDS
            return await asyncio.wait_for(run.proc.wait(), max(left, 0.0))
        except TimeoutError:
            await self._kill(run, "timeout")
            return await run.proc.wait()

    async def _kill(self, run: _Run, reason: PoolStatusReason) -> None:
        run.stop_reason = run.stop_reason or reason
        proc = run.proc
        if proc is None or proc.returncode is not None:
            return
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), self.cfg.kill_grace_seconds)
        except TimeoutError:
            _signal_group(proc.pid, signal.SIGKILL)

    async def _beat(self, run: _Run, *, heard: bool = True) -> None:
        """Hold the dispatch (`in_progress`) every heartbeat; `heard`: and tell the
        orchestrator it runs (not before `started`, which a heartbeat would stand in for)."""
        while True:
            await asyncio.sleep(self.cfg.heartbeat_seconds)
            if heard:
                await self._publish(self._status(run.dispatch, "heartbeat"))
            with contextlib.suppress(Exception):
                await run.msg.in_progress()

    def _exit_status(
        self, run: _Run, code: int, outputs: tuple[FileRef, ...], detail: str
    ) -> PoolStatus:
        return self._status(
            run.dispatch,
            "exited",
            reason=run.stop_reason or ("killed" if code < 0 else "exited"),
            exit_code=code if code >= 0 else None,
            signal=-code if code < 0 else None,
            warm=run.warm_key is not None,
            detail=detail,
            outputs=outputs,
        )

    @staticmethod
    def _detail(run: _Run) -> str:
        """The end of what the run logged: a resident runner says it (its log is shared by its
        activations); else, or if the runner died before it could, the log's end."""
        if isinstance(run.proc, ResidentRun) and run.proc.tail:
            return run.proc.tail
        return tail(run.log or run.root / "runner.log")

    async def _finish(self, run: _Run, status: PoolStatus) -> None:
        await self._report_end(run.msg, status)

    async def _report_end(self, msg: Msg, status: PoolStatus) -> None:
        """Ack, then tell the orchestrator: any end is final for this attempt. The end says
        whether the ack was confirmed — its message then left the work queue, and the
        orchestrator need not take it out (a JetStream request, and its advisory, saved per
        activation). An ack not confirmed at once does not hold the end back (JetStream slow
        while core NATS is fine, or this worker about to die): it goes out saying so — the
        orchestrator then takes the dispatch out itself — and the ack is tried again."""
        self._recent[status.dispatch_id] = (time.monotonic(), status)
        while len(self._recent) > RECENT_MAX:  # oldest first: the dict is in order of ends
            del self._recent[next(iter(self._recent))]
        acked = await self._ack(msg, status.dispatch_id, FIRST_ACK_SECONDS)
        if status.acked != acked:  # this ack's word (an end told again has its own)
            status = status.model_copy(update={"acked": acked})
            if status.dispatch_id in self._recent:
                self._recent[status.dispatch_id] = (self._recent[status.dispatch_id][0], status)
        await self._publish(status)
        log("worker.exited", dispatch=status.dispatch_id, reason=status.reason,
            exit_code=status.exit_code, signal=status.signal)  # fmt: skip
        if not acked:
            # Apart from the run: its slot, which the orchestrator counts free once it heard
            # the end, is let go now — tried in the run's task, the retries held it up to
            # 18 s, and the session's next dispatch, routed here, was handed back (cold).
            self._background(self._ack_again(msg, status.dispatch_id))

    async def _ack_again(self, msg: Msg, dispatch_id: str) -> None:
        for attempt in range(ACK_RETRIES):
            await asyncio.sleep(0.5 * (attempt + 1))
            if await self._ack(msg, dispatch_id, ACK_SECONDS):
                return

    @staticmethod
    async def _ack(msg: Msg, dispatch_id: str, timeout: float) -> bool:
        """Whether the server confirmed the ack within `timeout`."""
        try:
            await msg.ack_sync(timeout=timeout)
        except Exception as exc:
            log("worker.ack_failed", dispatch=dispatch_id, error=repr(exc))
            return False
        return True

    async def _release(self, run: _Run) -> None:
        if not run.spec:  # a resident runner's cgroup goes with the runner
            self._drop_cgroup(_run_cgroup(run))
        self._give_back_warm(run)
        self._discard(run.root)

    def _give_back_warm(self, run: _Run) -> None:
        """The run's warm session kept for its next activation (once: the end's report and
        the release both ask)."""
        key, run.warm_key = run.warm_key, None
        if key is not None:
            for old in self.warm.give_back(key, run.dispatch.idle_seconds):
                self._retire(old)
                self._discard(self.warm.path(old))

    def _expire_warm(self) -> None:
        """Drop the warm sessions idle past their TTL: their runners and workspaces."""
        for key in self.warm.expired():
            with contextlib.suppress(Exception):  # the others go whatever one key does
                log("worker.warm_session_expired", key=key)
                self._retire(key)
                self._discard(self.warm.path(key))

    def _discard(self, path: Path) -> None:
        """Move it aside at once (a new run may want the name), remove it in the background —
        made writable first if an agent made it read-only. Never raises: what cannot go is
        left, and the worker goes on."""
        trash = self.root / "trash" / secrets.token_hex(8)
        try:
            trash.parent.mkdir(parents=True, exist_ok=True)
            try:
                path.rename(trash)
            except PermissionError:  # moving a directory needs its own write permission
                if path.is_symlink():
                    raise
                path.chmod(stat.S_IRWXU)
                path.rename(trash)
        except FileNotFoundError:
            return
        except OSError as exc:  # left where it is: the worker goes on
            log("worker.discard_failed", path=str(path), error=repr(exc)[:300])
            return
        self._background(asyncio.to_thread(remove_tree, trash))

    # -- control subjects -------------------------------------------------------------------
    async def _on_cancel(self, msg: Msg) -> None:
        activation_id = msg.subject.rsplit(".", 1)[-1]
        try:
            wanted = PoolCancel.model_validate_json(msg.data or b"{}").dispatch_id
        except ValidationError:
            wanted = None
        self._cancelled[wanted or f"{activation_id}.*"] = time.monotonic()
        for run in list(self._runs.values()):
            if run.dispatch.input.activation.id == activation_id and wanted in {
                None,
                run.dispatch.dispatch_id,
            }:
                log("worker.cancelling", dispatch=run.dispatch.dispatch_id)
                run.stop_reason = run.stop_reason or "cancelled"
                run.halted.set()
                if run.proc is not None:
                    self._background(self._kill(run, "cancelled"))

    async def _on_list(self, msg: Msg) -> None:
        info = self._info(with_exited=True)
        with contextlib.suppress(ValidationError, ValueError):  # a request about one dispatch
            wanted = PoolListRequest.model_validate_json(msg.data).dispatch_id
            if wanted is not None:
                exited = tuple(s for s in info.exited if s.dispatch_id == wanted)
                info = info.model_copy(update={"exited": exited})
        with contextlib.suppress(Exception):
            await msg.respond(_fitting(info, self.nc.max_payload))

    async def _announce(self) -> None:
        """This worker's beat: that it is there, and what it runs and keeps warm."""
        with contextlib.suppress(Exception):
            await self.nc.publish(
                self.topology.pool_worker_subject(self.cfg.worker_id),
                self._info(with_exited=False).model_dump_json().encode(),
            )

    async def _presence(self) -> None:
        while True:
            await self._announce()
            self._expire_warm()  # presence goes on whatever a key does
            if self._forks is not None and not self._forks.alive:
                # Now, not at the next activation: until then /readyz would say it is down.
                self._background(self._revive_fork_server())
            horizon = time.monotonic() - self.cfg.recent_seconds
            self._recent = {k: v for k, v in self._recent.items() if v[0] > horizon}
            self._cancelled = {k: t for k, t in self._cancelled.items() if t > horizon}
            self._handed_back = {k: t for k, t in self._handed_back.items() if t > horizon}
            await asyncio.sleep(self.cfg.heartbeat_seconds)

    async def _drain(self) -> None:
        if self._tasks:
            log("worker.draining", running=len(self._runs))
            await asyncio.wait(set(self._tasks), timeout=self.cfg.drain_seconds)
        for run in list(self._runs.values()):
            self._background(self._kill(run, "shutdown"))
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self.cfg.kill_grace_seconds + 10)
        if self._aux:
            await asyncio.wait(set(self._aux), timeout=10)

    # -- helpers ------------------------------------------------------------------------------
    def _status(
        self, dispatch: ActivationDispatch, kind: PoolStatusKind, **fields: Any
    ) -> PoolStatus:
        return PoolStatus(
            kind=kind,
            dispatch_id=dispatch.dispatch_id,
            activation_id=dispatch.input.activation.id,
            attempt=dispatch.attempt,
            worker_id=self.cfg.worker_id,
            pool=self.cfg.pool,
            at=datetime.now(UTC),
            **fields,
        )

    def _info(self, *, with_exited: bool) -> PoolWorkerInfo:
        return PoolWorkerInfo(
            worker_id=self.cfg.worker_id,
            pool=self.cfg.pool,
            capacity=self.cfg.concurrency,
            at=datetime.now(UTC),
            # A run whose end was told is no longer running, though its task has not yet
            # let go of it (the ack's round trip): else a listing then says both.
            running=tuple(
                r.started
                for did, r in self._runs.items()
                if r.started is not None and did not in self._recent
            ),
            exited=tuple(s for _, s in self._recent.values()) if with_exited else (),
            warm_sessions=len(self.warm),
            # Only while routed dispatches reach this worker and start here: else none must
            # be sent here.
            takes_routed=self._own_bound and not self._faulty(),
            warm_keys=tuple(self.warm.keys()[:MAX_WARM_KEYS])
            if self._own_bound and not self._faulty()
            else (),
        )

    async def _publish(self, status: PoolStatus, *, flush: bool = False) -> None:
        try:
            await self.nc.publish(
                self.topology.pool_status_subject(status.activation_id),
                status.model_dump_json().encode(),
            )
            if flush:
                await self.nc.flush(timeout=5)
        except Exception as exc:
            log(
                "worker.publish_failed",
                dispatch=status.dispatch_id,
                kind=status.kind,
                error=repr(exc),
            )

    def _background(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._aux.add(task)
        task.add_done_callback(self._aux.discard)


def serve(config: WorkerConfig) -> int:
    """Run a worker until SIGTERM or SIGINT; returns the process's exit code."""
    # Before the fork server starts: it and the runners it forks take the worker's policy.
    if why_not := cpu.apply(config.cpu_policy):
        log("worker.cpu_policy_unchanged", policy=config.cpu_policy, reason=why_not)
    # The runners' commands run as this worker's user: none may read its memory or its
    # /proc/<pid>/environ, where its NATS credentials are (a runner reads its parent's pid).
    if _libc is not None:
        _libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        heap.settle()
        try:
            await Worker(config).run(stop)
        except health.HealthEndpointError as exc:  # better ended than run unprobed
            log("worker.stopped", worker=config.worker_id, reason=str(exc))
            return 1
        return 0

    return eventloop.run(main())


def _run_cgroup(run: _Run) -> str:
    return f"run-{run.dispatch.dispatch_id}"


def _started(pid: int) -> int | None:
    """A process's start time in clock ticks (a pid is the same process only if it matches)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


LOCK_FILE = ".lock"
DEAD_WORKER_MIN_AGE_SECONDS = 60.0  # a lock younger may be a starting worker's, not yet held


def _claim(root: Path) -> IO[bytes] | None:
    """Hold `root`'s lock for the worker's life: a worker killed outright lets go of it with
    its process, and the next worker on the host sweeps the directory it left. None when
    another live worker holds it (one of the same id: said, and gone on with)."""
    root.mkdir(parents=True, exist_ok=True)
    lock = (root / LOCK_FILE).open("ab")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        log("worker.directory_shared", directory=str(root))
        return None
    return lock


def _sweep_dead_workers(workdir: Path, own: Path) -> None:
    """Remove the directories other workers killed outright left under `workdir` (their
    runs' inputs with their tokens, their warm sessions' workspaces): those whose lock nobody
    holds. One without a lock file is left alone — not known to be a worker's."""
    with contextlib.suppress(OSError):
        for other in workdir.iterdir():
            lock_path = other / LOCK_FILE
            if other == own or other.is_symlink() or not lock_path.is_file():
                continue
            with contextlib.suppress(OSError):
                if time.time() - lock_path.stat().st_mtime < DEAD_WORKER_MIN_AGE_SECONDS:
                    continue
                with lock_path.open("ab") as lock:
                    try:
                        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue  # its worker lives
                    log("worker.swept_dead_worker", directory=str(other))
                    remove_tree(other)


def _tree_alive(name: str) -> bool:
    """Whether the worker whose cgroup tree this is still runs (a name not of the form is
    taken for a live one's: left alone)."""
    parts = name.rsplit("-", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return True
    return _started(int(parts[1])) == int(parts[2])


def _fitting(info: PoolWorkerInfo, limit: int) -> bytes:
    """The answer within the server's max_payload: a busy worker's recent exits (ten minutes
    of them) could pass it, and an answer too large is no answer. The newest exits stay, with
    the ends of their logs shortened; then as many as fit."""
    body = info.model_dump_json().encode()
    if len(body) <= limit:
        return body
    exited = [
        s.model_copy(update={"detail": s.detail[-200:]})
        for s in sorted(info.exited, key=lambda s: s.at, reverse=True)
    ]
    while True:
        body = info.model_copy(update={"exited": tuple(exited)}).model_dump_json().encode()
        if len(body) <= limit or not exited:
            return body
        exited = exited[: len(exited) // 2]
