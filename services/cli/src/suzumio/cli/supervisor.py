"""`suzumio up`: the whole platform on one machine, as child processes of one supervisor.

Order matters: the embedded servers start first and stop last; the session service (which
applies migrations and hosts the projector) starts before the others. A child that crashes
is restarted with exponential backoff; SIGINT/SIGTERM stops every child with SIGTERM (each
drains within 10 s), then the servers. Children also get a parent-death signal, so even a
SIGKILLed supervisor leaves no orphans behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field

from suzumio.cli.admin import ADMIN_KEY_FILE, bootstrap_admin
from suzumio.platform.bus import connection
from suzumio.platform.embedded import EmbeddedServers
from suzumio.platform.embedded.process import child_setup
from suzumio.platform.logging import get_logger
from suzumio.platform.secrets import secret_keys
from suzumio.platform.service.probe import get_status
from suzumio.platform.settings import PlatformSettings

log = get_logger("suzumio.supervisor")

STOP_TIMEOUT = 10.0
MAX_BACKOFF = 30.0
HEALTHY_AFTER = 60.0  # a child up this long has its restart backoff reset


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    port: int
    module: str = ""  # `suzumio.<name>` unless given
    args: tuple[str, ...] = ()
    ready_path: str = "/readyz"

    @property
    def argv(self) -> tuple[str, ...]:
        return ("-m", self.module or f"suzumio.{self.name}", *self.args)


@dataclass
class _Child:
    spec: ServiceSpec
    process: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff: float = 1.0


@dataclass
class Supervisor:
    settings: PlatformSettings
    host: str = "127.0.0.1"
    services: tuple[ServiceSpec, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)
    banner: tuple[str, ...] = ()  # more lines for the "is up" message
    ready_timeout: float = 120.0
    _children: dict[str, _Child] = field(default_factory=dict)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)

    def run(self) -> int:
        """Start everything and block until stopped; the process exit code."""
        servers: EmbeddedServers | None = None
        nats_url = self.settings.nats_url
        db_url = (
            self.settings.database_url.get_secret_value() if self.settings.database_url else None
        )
        if not (nats_url and db_url):
            print(
                f"Starting embedded servers in {self.settings.data_dir.resolve()} ...", flush=True
            )
            servers = EmbeddedServers(self.settings.data_dir).ensure(
                need_nats=nats_url is None, need_postgres=db_url is None
            )
            nats_url = nats_url or (servers.nats.url if servers.nats else None)
            db_url = db_url or (servers.postgres.url if servers.postgres else None)
        assert nats_url
        assert db_url
        secret_keys(self.settings)  # made once here, before the children race to make it
        env = {
            **os.environ,
            "SUZUMIO_NATS_URL": nats_url,
            "SUZUMIO_DATABASE_URL": db_url,
            "SUZUMIO_DATA_DIR": str(self.settings.data_dir.resolve()),
            **self.extra_env,
        }
        try:
            return asyncio.run(self._supervise(env, nats_url))
        finally:
            if servers is not None:
                servers.stop()
                print("Embedded servers stopped.", flush=True)

    async def _supervise(self, env: dict[str, str], nats_url: str) -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        watchers = []
        for spec in self.services:
            child = self._children[spec.name] = _Child(spec)
            await self._start(child, env)
            watchers.append(asyncio.create_task(self._watch(child, env)))
        ready = asyncio.create_task(self._announce(nats_url))
        await stop.wait()
        self._stopping.set()
        ready.cancel()
        print("\nStopping Suzumio ...", flush=True)
        await self._stop_all()
        for watcher in watchers:
            watcher.cancel()
        return 0

    async def _start(self, child: _Child, env: dict[str, str]) -> None:
        child_env = {
            **env,
            "SUZUMIO_HTTP_PORT": str(child.spec.port),
            "SUZUMIO_HTTP_HOST": self.host,
        }
        child.process = await asyncio.create_subprocess_exec(
            sys.executable,
            *child.spec.argv,
            env=child_env,
            stdin=asyncio.subprocess.DEVNULL,
            preexec_fn=child_setup(signal.SIGTERM),
        )
        child.started_at = time.monotonic()
        log.info("supervisor.started", service=child.spec.name, pid=child.process.pid)

    async def _watch(self, child: _Child, env: dict[str, str]) -> None:
        while True:
            assert child.process is not None
            code = await child.process.wait()
            if self._stopping.is_set():
                return
            if time.monotonic() - child.started_at > HEALTHY_AFTER:
                child.backoff = 1.0
            log.warning(
                "supervisor.crashed",
                service=child.spec.name,
                exit_code=code,
                restart_in=child.backoff,
            )
            await asyncio.sleep(child.backoff)
            if self._stopping.is_set():
                return
            child.backoff = min(child.backoff * 2, MAX_BACKOFF)
            child.restarts += 1
            await self._start(child, env)

    async def _announce(self, nats_url: str) -> None:
        deadline = time.monotonic() + self.ready_timeout
        waiting = {c.spec for c in self._children.values()}
        while waiting and time.monotonic() < deadline:
            for spec in list(waiting):
                if await get_status(self.host, spec.port, spec.ready_path) == 200:
                    waiting.discard(spec)
            await asyncio.sleep(0.2)
        if waiting:
            names = ", ".join(sorted(s.name for s in waiting))
            print(f"Still not ready after {self.ready_timeout:.0f}s: {names}", flush=True)
            return
        admin = await self._bootstrap_admin(nats_url)
        api = next(s for s in self.services if s.name == "gateway")
        broker = next(s for s in self.services if s.name == "toolbroker")
        print(
            "\nSuzumio is up.\n"
            f"  API and web page: http://{self.host}:{api.port}  (OpenAPI: /docs)\n"
            f"  tool-broker:      http://{self.host}:{broker.port}\n"
            f"  NATS:             {nats_url}\n"
            + "".join(f"  {line}\n" for line in self.banner)
            + f"{admin}"
            "Press Ctrl-C to stop.\n",
            flush=True,
        )

    async def _bootstrap_admin(self, nats_url: str) -> str:
        data_dir = self.settings.data_dir.resolve()
        nc = await connection.connect(nats_url, "suzumio-supervisor")
        try:
            key = await bootstrap_admin(nc, self.settings.topology(), data_dir)
        finally:
            await nc.close()
        if key is not None:
            return (
                f"  admin API key:    {key}\n"
                f"                    (shown once; also in {data_dir / ADMIN_KEY_FILE})\n"
            )
        if (data_dir / ADMIN_KEY_FILE).exists():
            return f"  admin API key:    in {data_dir / ADMIN_KEY_FILE}\n"
        return "  admin API key:    the platform has an admin already\n"

    async def _stop_all(self) -> None:
        # Reverse start order: the gateway stops taking requests first, the session service
        # (whose projector others read from) last.
        order = [
            self._children[s.name] for s in reversed(self.services) if s.name in self._children
        ]
        for child in order:
            if child.process is not None and child.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGTERM)
        await asyncio.gather(*(self._reap(c) for c in order))

    @staticmethod
    async def _reap(child: _Child) -> None:
        if child.process is None:
            return
        try:
            await asyncio.wait_for(child.process.wait(), STOP_TIMEOUT)
        except TimeoutError:
            log.warning("supervisor.killing", service=child.spec.name)
            with contextlib.suppress(ProcessLookupError):
                child.process.kill()
            await child.process.wait()
