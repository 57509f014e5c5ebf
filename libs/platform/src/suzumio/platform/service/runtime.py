"""One service process from start to a drained exit.

`run_service` reads settings, configures logs and telemetry, finds or starts the embedded
servers when no URLs are set, then runs the service's `setup` inside a `ServiceRuntime`, which
owns the connections, the health endpoints, the background tasks and the shutdown order:
on SIGTERM (or SIGINT) it stops taking work, lets in-flight work finish within the drain
period, and exits well inside the 10 s a supervisor or Kubernetes gives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import uvicorn
from nats.aio.client import Client as NATS
from starlette.applications import Starlette
from starlette.types import ASGIApp

from suzumio.contracts.subjects import Storage, Topology
from suzumio.platform import telemetry
from suzumio.platform.bus import connection
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.bus.jsapi import (
    ERR_STREAM_NOT_FOUND,
    ensure_stream,
    ensure_streams,
    stream_state,
)
from suzumio.platform.bus.kv import ensure_kv
from suzumio.platform.db import pool as db
from suzumio.platform.db.migrations import apply_migrations, platform_migrations
from suzumio.platform.db.pool import Pool
from suzumio.platform.embedded import EmbeddedServers
from suzumio.platform.errors import JetStreamApiError
from suzumio.platform.logging import configure_logging, get_logger
from suzumio.platform.service import cpu, heap, heartbeat
from suzumio.platform.service.bodylimit import BodyLimit, BodyLimits
from suzumio.platform.service.health import Readiness
from suzumio.platform.service.http_protocol import BoundedHttpToolsProtocol
from suzumio.platform.service.stream_cut import quiet_uvicorn_cuts
from suzumio.platform.service.unix_socket import UnixListener, bind_unix
from suzumio.platform.settings import PlatformSettings, ServiceSettings

log = get_logger(__name__)
WS_MAX_MESSAGE_BYTES = 4096  # what a client may send on a WebSocket (nothing is expected)

S = TypeVar("S", bound=ServiceSettings)
Task = Callable[[asyncio.Event], Coroutine[Any, Any, None]]
Drainer = Callable[[float], Awaitable[None]]
Setup = Callable[["ServiceRuntime"], Awaitable[ASGIApp | None]]

STREAMS_RECHECK_SECONDS = 5.0  # how soon a stream lost with a NATS restart is made again


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the runtime decides when HTTP stops."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class ServiceRuntime:
    """Connections and lifecycle of one service process (tests build it the same way)."""

    def __init__(
        self, name: str, settings: ServiceSettings, *, nats_url: str, database_url: str
    ) -> None:
        self.name = name
        self.settings = settings
        self.topology: Topology = settings.topology()
        self.nats_url = nats_url
        self.database_url = database_url
        self.instance = settings.instance or f"{socket.gethostname()}:{os.getpid()}"
        self.status: dict[str, Any] = {}  # what the service adds to its heartbeat (JSON-safe)
        self._tasks: list[tuple[str, Task]] = []
        self._drainers: list[Drainer] = []
        self._nc: NATS | None = None
        self._pool: Pool | None = None
        self._store: EventStore | None = None
        self._readiness: Readiness | None = None
        self._body_limits: BodyLimits | None = None
        self._unix_paths: list[Path] = []
        self.http_port: int | None = None

    # -- what services use -------------------------------------------------------------
    @property
    def nc(self) -> NATS:
        assert self._nc is not None, "runtime not opened"
        return self._nc

    @property
    def pool(self) -> Pool:
        assert self._pool is not None, "runtime not opened"
        return self._pool

    @property
    def store(self) -> EventStore:
        assert self._store is not None, "runtime not opened"
        return self._store

    @property
    def readiness(self) -> Readiness:
        assert self._readiness is not None, "runtime not opened"
        return self._readiness

    def commands(self, timeout: float = 10.0) -> CommandClient:
        return CommandClient(self.nc, self.topology, timeout=timeout)

    def background(self, name: str, task: Task) -> None:
        """Run `task(stop)` while the service runs; it must return soon after `stop` is set."""
        self._tasks.append((name, task))

    def limit_bodies(self, limits: BodyLimits) -> None:
        """Refuse request bodies over `limits` with 413 before the service reads them (see
        `bodylimit`); without it a service takes bodies of any size."""
        self._body_limits = limits

    def serve_unix(self, path: Path) -> None:
        """Serve HTTP on a Unix socket at `path` too (see `unix_socket`), the same app."""
        self._unix_paths.append(path)

    def on_drain(self, drainer: Drainer) -> None:
        """Call `drainer(seconds_left)` at shutdown, before background tasks are stopped."""
        self._drainers.append(drainer)

    # -- lifecycle -----------------------------------------------------------------------
    async def open(self) -> None:
        self._nc = await connection.connect(self.nats_url, f"suzumio-{self.name}")
        await ensure_streams(self._nc, self.topology.streams())
        self._pool = await db.create_pool(
            self.database_url, f"suzumio-{self.name}", max_size=self.settings.db_pool_max
        )
        await apply_migrations(self._pool, platform_migrations())
        self._store = EventStore(self._nc, self.topology)
        self._readiness = Readiness(self.name, self._nc, self._pool, self.topology)
        services = await ensure_kv(
            self._nc.jetstream(),
            self.topology.bucket(heartbeat.BUCKET),
            ttl=heartbeat.TTL_SECONDS,
            replicas=self.settings.replicas,
        )
        beat = heartbeat.Heartbeat(services, self.name, self.instance, self._describe)
        self.background("heartbeat", beat.run)
        self.background("streams", self._keep_streams)
        telemetry.meter.create_observable_gauge(
            "suzumio_projection_lag",
            callbacks=[self._readiness.observe_lag],
            description="events in the log not yet applied, per projection",
        )

    async def _keep_streams(self, stop: asyncio.Event) -> None:
        """Make again a memory stream that is gone: a restarted NATS server has lost them
        (LIVE), and nothing else makes them after start-up, so without this every `/readyz`
        would say not ready, and live output have nowhere to go, until a restart. A file
        stream is never made again here: one that is gone lost the data it held (or is not
        recovered yet), and an empty one in its place would pass for the log."""
        memory = [s for s in self.topology.streams() if s.storage is Storage.MEMORY]
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), STREAMS_RECHECK_SECONDS)
            if stop.is_set() or not self.nc.is_connected:
                continue
            for spec in memory:
                if not await self._stream_gone(spec.name):
                    continue
                try:
                    await ensure_stream(self.nc, spec, timeout=2)
                except Exception as exc:
                    log.warning("stream.recreate_failed", stream=spec.name, error=repr(exc))
                else:
                    log.warning("stream.recreated", stream=spec.name)

    async def _stream_gone(self, name: str) -> bool:
        try:
            await stream_state(self.nc, name, timeout=2)
        except JetStreamApiError as exc:
            return exc.err_code == ERR_STREAM_NOT_FOUND
        except Exception:  # NATS away for now: the next round looks again
            return False
        return False

    def _describe(self) -> dict[str, Any]:
        return {
            **self.status,
            "http": f"http://{self.settings.http_host}:{self.http_port}",
            "pid": os.getpid(),
            "draining": self._readiness.draining if self._readiness else False,
        }

    async def close(self) -> None:
        if self._nc is not None and not self._nc.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._nc.drain(), 2.0)
            with contextlib.suppress(Exception):
                await self._nc.close()
        if self._pool is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._pool.close(), 2.0)

    async def serve(self, app: ASGIApp | None = None, stop: asyncio.Event | None = None) -> None:
        """Serve HTTP and the background tasks until `stop` is set, then drain."""
        stop = stop or asyncio.Event()
        quiet_uvicorn_cuts()
        http_app = app or Starlette(routes=self.readiness.routes())
        if self._body_limits is not None:
            http_app = BodyLimit(http_app, self._body_limits)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.settings.http_host, self.settings.http_port))
        self.http_port = sock.getsockname()[1]
        unix: list[UnixListener] = []
        try:
            unix.extend(bind_unix(path) for path in self._unix_paths)
        except BaseException:
            sock.close()
            for listener in unix:
                listener.sock.close()
                listener.remove()
            raise
        server = _Server(
            uvicorn.Config(
                http_app,
                # httptools (parsing in C), with the head's bound that uvicorn gives only h11.
                http=BoundedHttpToolsProtocol,
                # The platform's WebSockets only send (the gateway's stream): a client's
                # message is never read, and uvicorn holds one, of up to 16 MiB by default,
                # for the socket's life.
                ws_max_size=WS_MAX_MESSAGE_BYTES,
                log_config=None,
                access_log=False,
                lifespan="off",
                timeout_graceful_shutdown=max(int(self.settings.drain_seconds) - 2, 1),
            )
        )
        sockets = [sock, *(listener.sock for listener in unix)]
        http = asyncio.create_task(server.serve(sockets=sockets), name="http")
        running = [asyncio.create_task(task(stop), name=n) for n, task in self._tasks]
        log.info(
            "service.started",
            http=f"http://{self.settings.http_host}:{self.http_port}",
            unix=[str(listener.path) for listener in unix] or None,
            instance=self.instance,
        )
        watch = [asyncio.create_task(stop.wait()), http, *running]
        done, _ = await asyncio.wait(watch, return_when=asyncio.FIRST_COMPLETED)
        crashed = [t for t in done if t is not watch[0] and t.exception() is not None]
        for task in crashed:
            log.error("service.task_crashed", task=task.get_name(), exc_info=task.exception())
        stop.set()
        try:
            await self._drain(server, http, running)
        finally:
            for listener in unix:
                listener.remove()
        if crashed:
            raise SystemExit(1)

    async def _drain(
        self, server: _Server, http: asyncio.Task[None], running: list[asyncio.Task[None]]
    ) -> None:
        deadline = asyncio.get_running_loop().time() + self.settings.drain_seconds
        self.readiness.draining = True
        log.info("service.draining", seconds=self.settings.drain_seconds)

        def left() -> float:
            return max(deadline - asyncio.get_running_loop().time(), 0.1)

        for drainer in self._drainers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(drainer(left()), left())
        if running:
            _, late = await asyncio.wait(running, timeout=left())
            for task in late:
                log.warning("service.task_cancelled", task=task.get_name())
                task.cancel()
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(http, left())
        await self.close()
        log.info("service.stopped")


def resolve_endpoints(settings: PlatformSettings) -> tuple[str, str, EmbeddedServers | None]:
    """The NATS and Postgres URLs: configured ones, else the data directory's embedded servers."""
    nats_url = settings.nats_url
    database_url = settings.database_url.get_secret_value() if settings.database_url else None
    if nats_url and database_url:
        return nats_url, database_url, None
    servers = EmbeddedServers(
        settings.data_dir, nats_sync_interval=settings.nats_sync_interval
    ).ensure(need_nats=not nats_url, need_postgres=not database_url)
    nats_url = nats_url or (servers.nats.url if servers.nats else None)
    database_url = database_url or (servers.postgres.url if servers.postgres else None)
    assert nats_url
    assert database_url
    return nats_url, database_url, servers


def run_service(name: str, settings: S, setup: Setup) -> None:
    """The body of `python -m suzumio.<name>`."""
    configure_logging(name, level=settings.log_level, fmt=settings.log_format)
    # Before the embedded servers this process may start: they take it from the process.
    if why_not := cpu.apply(settings.cpu_policy):
        log.warning("service.cpu_policy_unchanged", policy=settings.cpu_policy, reason=why_not)
    nats_url, database_url, servers = resolve_endpoints(settings)
    runtime = ServiceRuntime(name, settings, nats_url=nats_url, database_url=database_url)
    telemetry_handle = telemetry.setup_telemetry(name, runtime.instance)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # from the start: a stop during start-up
            loop.add_signal_handler(sig, stop.set)  # is a clean exit too
        try:
            # Start-up waits for NATS as long as it takes, so a stop must be able to end the
            # wait: else a service told to stop while NATS is away (a SIGKILLed `suzumio up`
            # takes the embedded server with it) would wait for it forever, an orphan.
            starting = asyncio.create_task(_start(runtime, setup))
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if not starting.done():
                starting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await starting
                log.info("service.stopped", while_starting=True)
                return
            app = starting.result()
            heap.settle()
            if not stop.is_set():
                await runtime.serve(app, stop)
        finally:
            await runtime.close()

    try:
        _run(main())
    finally:
        telemetry_handle.shutdown()
        if servers is not None:
            servers.stop()


async def _start(runtime: ServiceRuntime, setup: Setup) -> ASGIApp | None:
    await runtime.open()
    return await setup(runtime)


def _run(coro: Coroutine[Any, Any, None]) -> None:
    if sys.platform != "win32":
        import uvloop  # noqa: PLC0415 - optional speed-up where available

        uvloop.run(coro)
    else:  # pragma: no cover
        asyncio.run(coro)
