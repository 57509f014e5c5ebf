"""`suzumio up`: the whole platform on one machine, as child processes of one supervisor.

Order matters: the ports are checked first (a port in use is an error before anything
starts); the embedded servers start next and stop last; the session service (which applies
migrations and hosts the projector) starts before the others. A child that crashes is
restarted with exponential backoff, but one that crashes `start_crash_limit` times before it
was ever ready is a failure: everything stops and the exit code is 1, with its last lines.
A child counts as ready only when its own process listens on its port and answers there (at
the address it binds), so another program on that port is never mistaken for it.
SIGINT/SIGTERM stops every child with SIGTERM (each drains within 10 s), then the servers.
Children also get a parent-death signal, so even a SIGKILLed supervisor leaves no orphans.
One `up` at a time holds a data directory (a lock the kernel drops however it ends): a second
one would borrow the first one's embedded servers and lose them when the first one stops.
An embedded server that dies is started again on its port (the services reconnect by
themselves); one that cannot be stops everything, exit code 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import signal
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from suzumio.cli.admin import (
    ADMIN_KEY_FILE,
    AdminUnconfirmedError,
    KeyFileError,
    bootstrap_admin,
)
from suzumio.cli.failures import first_line
from suzumio.contracts.errors import CommandError
from suzumio.platform.bus import connection
from suzumio.platform.embedded import EmbeddedServers
from suzumio.platform.embedded.credentials import redact
from suzumio.platform.embedded.process import child_setup
from suzumio.platform.errors import EmbeddedServerError
from suzumio.platform.logging import get_logger
from suzumio.platform.secrets import secret_keys
from suzumio.platform.service import cpu
from suzumio.platform.service.probe import get_status
from suzumio.platform.settings import PlatformSettings

log = get_logger("suzumio.supervisor")

STOP_TIMEOUT = 10.0
MAX_BACKOFF = 30.0
HEALTHY_AFTER = 60.0  # a child up this long has its restart backoff reset
TAIL_LINES = 15  # a child's last stderr lines, shown when it keeps failing to start
UP_LOCK = "up.lock"  # in the data directory: held by the `up` that runs there
SERVER_POLL = 0.5  # seconds between looks at the embedded servers
SERVER_RESTART_LIMIT = 3  # failed restarts in a row of an embedded server that stop everything


class CannotStartError(Exception):
    """`up` cannot start here; the message says why, in words a person can act on."""


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    port: int
    module: str = ""  # `suzumio.<name>` unless given
    args: tuple[str, ...] = ()
    ready_path: str = "/readyz"
    host: str | None = None  # the address it binds when not the supervisor's `host`

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
    ready: bool = False  # answered on its port at least once (since then, crashes are outages)
    start_crashes: int = 0
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    forwarder: asyncio.Task[None] | None = None


@dataclass
class Supervisor:
    settings: PlatformSettings
    host: str = "127.0.0.1"
    services: tuple[ServiceSpec, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)
    banner: tuple[str, ...] = ()  # more lines for the "is up" message
    ready_timeout: float = 120.0
    start_crash_limit: int = 3
    first_backoff: float = 1.0
    _children: dict[str, _Child] = field(default_factory=dict)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _failed: _Child | None = None
    _fatal: str | None = None  # why everything stopped, when it was not a child

    def bind_host(self, spec: ServiceSpec) -> str:
        return spec.host or self.host

    def probe_host(self, spec: ServiceSpec) -> str:
        """Where this machine reaches what `spec` binds (a wildcard is reached on loopback)."""
        host = self.bind_host(spec)
        return {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104

    def busy_ports(self) -> list[str]:
        """Why each listener could not bind now (empty when all can)."""
        problems = []
        for spec in self.services:
            host = self.bind_host(spec)
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
                try:
                    sock.bind((host, spec.port))
                except OSError as exc:
                    reason = "is in use" if exc.errno == errno.EADDRINUSE else f": {exc.strerror}"
                    problems.append(f"port {spec.port} ({spec.name}) on {host} {reason}".strip())
        return problems

    def claim_data_dir(self) -> TextIO:
        """The data directory, locked for this `up` until the returned file is closed (or the
        process ends, however it ends: the kernel drops the lock, so none is ever stale)."""
        data_dir = self.settings.data_dir.resolve()
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            handle = (data_dir / UP_LOCK).open("a+")
        except OSError as exc:
            raise CannotStartError(
                f"the data directory {data_dir} cannot be used: {exc.strerror or exc}"
            ) from exc
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if not isinstance(exc, BlockingIOError):
                handle.close()
                raise CannotStartError(
                    f"the data directory {data_dir} cannot be locked: {exc.strerror or exc}"
                ) from exc
            handle.seek(0)
            holder = handle.read().strip() or "?"
            handle.close()
            raise CannotStartError(
                f"another `suzumio up` (pid {holder}) runs with the data directory {data_dir}."
                " Stop it, or give this one its own SUZUMIO_DATA_DIR"
            ) from exc
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        return handle

    def run(self) -> int:
        """Start everything and block until stopped; the process exit code."""
        try:
            claim = self.claim_data_dir()
        except CannotStartError as exc:
            print(f"Cannot start Suzumio: {exc}.", file=sys.stderr, flush=True)
            return 1
        with claim:
            return self._run()

    def _run(self) -> int:
        busy = self.busy_ports()
        if busy:
            print(
                "Cannot start Suzumio: " + "; ".join(busy) + ".\n"
                "Is Suzumio (or something else) already running there? Stop it, or choose other"
                " ports with --api-port, --broker-port and --internal-ports-from.",
                file=sys.stderr,
                flush=True,
            )
            return 1
        # The embedded servers and the services take the platform's CPU policy from here.
        if why_not := cpu.apply(self.settings.cpu_policy):
            log.warning("up.cpu_policy_unchanged", policy=self.settings.cpu_policy, reason=why_not)
        servers: EmbeddedServers | None = None
        nats_url = self.settings.nats_url
        db_url = (
            self.settings.database_url.get_secret_value() if self.settings.database_url else None
        )
        try:
            secret_keys(self.settings)  # made once here, before the children race to make it
            if not (nats_url and db_url):
                print(
                    f"Starting embedded servers in {self.settings.data_dir.resolve()} ...",
                    flush=True,
                )
                servers = EmbeddedServers(
                    self.settings.data_dir, nats_sync_interval=self.settings.nats_sync_interval
                ).ensure(need_nats=not nats_url, need_postgres=not db_url)
        except (OSError, EmbeddedServerError) as exc:  # TimeoutError is an OSError
            print(f"Cannot start Suzumio: {first_line(exc)}", file=sys.stderr, flush=True)
            return 1
        if servers is not None:
            nats_url = nats_url or (servers.nats.url if servers.nats else None)
            db_url = db_url or (servers.postgres.url if servers.postgres else None)
        assert nats_url
        assert db_url
        env = {
            **os.environ,
            "SUZUMIO_NATS_URL": nats_url,
            "SUZUMIO_DATABASE_URL": db_url,
            "SUZUMIO_DATA_DIR": str(self.settings.data_dir.resolve()),
            **self.extra_env,
        }
        try:
            return asyncio.run(self._supervise(env, nats_url, servers))
        finally:
            if servers is not None:
                servers.stop()
                print("Embedded servers stopped.", flush=True)

    async def _supervise(
        self, env: dict[str, str], nats_url: str, servers: EmbeddedServers | None = None
    ) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stop.set)
        if self.settings.log_format == "auto":
            # Children's stderr is a pipe to us: let them pick the format our terminal suits.
            env = {**env, "SUZUMIO_LOG_FORMAT": "console" if sys.stderr.isatty() else "json"}
        watchers = []
        for spec in self.services:
            child = self._children[spec.name] = _Child(spec, backoff=self.first_backoff)
            await self._start(child, env)
            watchers.append(asyncio.create_task(self._watch(child, env)))
        if servers is not None:
            watchers.append(asyncio.create_task(self._keep_servers(servers)))
        ready = asyncio.create_task(self._announce(nats_url))
        ready.add_done_callback(_announce_failed)  # nobody awaits it: say what ended it
        await self._stop.wait()
        self._stopping.set()
        ready.cancel()
        if self._failed is not None:
            self._report(self._failed)
        if self._fatal is not None:
            print(f"\n{self._fatal}", file=sys.stderr, flush=True)
        print("\nStopping Suzumio ...", flush=True)
        await self._stop_all()
        for watcher in watchers:
            watcher.cancel()
        return 0 if self._failed is None and self._fatal is None else 1

    async def _keep_servers(self, servers: EmbeddedServers) -> None:
        """Start again an embedded server that died: the services wait for it (they reconnect
        forever), so without this the platform would stay down with nothing said."""
        failures = 0
        while not self._stopping.is_set():
            await asyncio.sleep(SERVER_POLL)
            for server in servers.gone():
                if self._stopping.is_set():
                    return
                code = server.process.returncode if server.process is not None else None
                log.error("up.server_exited", server=server.name, pid=server.pid, code=code)
                print(
                    f"The embedded {server.name} server (pid {server.pid}) exited (code {code});"
                    " starting it again ...",
                    file=sys.stderr,
                    flush=True,
                )
                try:
                    # Here, in the main thread, which the server's parent-death signal is
                    # bound to (a worker thread's end would stop it). It blocks the loop
                    # while the server starts; the services wait for it meanwhile anyway.
                    again = servers.restart(server)
                except (OSError, EmbeddedServerError) as exc:
                    failures += 1
                    log.warning("up.server_restart_failed", server=server.name, error=str(exc))
                    if failures >= SERVER_RESTART_LIMIT:
                        self._fatal = (
                            f"The embedded {server.name} server could not be started again"
                            f" ({failures} tries): {first_line(exc)}; giving up."
                        )
                        self._stop.set()
                        return
                    await asyncio.sleep(failures)
                    break
                failures = 0
                print(
                    f"The embedded {server.name} server runs again (pid {again.pid}).",
                    file=sys.stderr,
                    flush=True,
                )

    def _report(self, child: _Child) -> None:
        code = child.process.returncode if child.process else None
        lines = "".join(f"  | {line}\n" for line in child.tail) or "  (it printed nothing)\n"
        print(
            f"\n{child.spec.name} exited (code {code}) {child.start_crashes} times before it was"
            f" ever ready; giving up. Its last lines:\n{lines}",
            file=sys.stderr,
            end="",
            flush=True,
        )

    async def _start(self, child: _Child, env: dict[str, str]) -> None:
        child_env = {
            **env,
            "SUZUMIO_HTTP_PORT": str(child.spec.port),
            "SUZUMIO_HTTP_HOST": self.bind_host(child.spec),
            "PYTHONUNBUFFERED": "1",
        }
        child.tail.clear()
        child.process = await asyncio.create_subprocess_exec(
            sys.executable,
            *child.spec.argv,
            env=child_env,
            stdin=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,  # passed through, and its tail kept for errors
            preexec_fn=child_setup(signal.SIGTERM),
        )
        assert child.process.stderr is not None
        child.forwarder = asyncio.create_task(self._forward(child, child.process.stderr))
        child.started_at = time.monotonic()
        log.info("supervisor.started", service=child.spec.name, pid=child.process.pid)

    @staticmethod
    async def _forward(child: _Child, stream: asyncio.StreamReader) -> None:
        partial = b""
        while chunk := await stream.read(65536):
            # Whatever becomes of our own stderr (a closed pipe), the child's pipe is still
            # read: a child whose stderr nobody reads blocks on its next log line.
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.buffer.write(chunk)
                sys.stderr.buffer.flush()
            *lines, partial = (partial + chunk).split(b"\n")
            child.tail.extend(line.decode(errors="replace") for line in lines)
            partial = partial[-4096:]
        if partial:
            child.tail.append(partial.decode(errors="replace"))

    async def _watch(self, child: _Child, env: dict[str, str]) -> None:
        while True:
            assert child.process is not None
            code = await child.process.wait()
            if child.forwarder is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(child.forwarder, 2.0)  # its last lines
            if self._stopping.is_set():
                return
            if not child.ready:
                child.start_crashes += 1
                if child.start_crashes >= self.start_crash_limit:
                    self._failed = child
                    self._stop.set()
                    return
            if time.monotonic() - child.started_at > HEALTHY_AFTER:
                child.backoff = self.first_backoff
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
        """Wait until every service answers, then make the first admin and say so. A service
        slow to get ready (a large rebuild, a slow disk) is said to be, once, and waited for
        still: given up on, the platform came up with no admin key and no word of it, and
        the service was never counted ready — three crashes hours later stopped everything
        as if it had never started."""
        deadline = time.monotonic() + self.ready_timeout
        waiting = dict(self._children)
        told = False
        while waiting:
            for name, child in list(waiting.items()):
                if await self._is_ready(child):
                    child.ready = True
                    del waiting[name]
            if waiting and not told and time.monotonic() >= deadline:
                names = ", ".join(sorted(waiting))
                print(
                    f"Still not ready after {self.ready_timeout:.0f}s: {names} (waiting on)",
                    flush=True,
                )
                told = True
            if waiting:
                await asyncio.sleep(1.0 if told else 0.2)
        admin = await self._bootstrap_admin(nats_url)
        api = next(s for s in self.services if s.name == "gateway")
        broker = next(s for s in self.services if s.name == "toolbroker")
        print(
            "\nSuzumio is up.\n"
            f"  API and web page: http://{url_host(self.host)}:{api.port}  (OpenAPI: /docs)\n"
            f"  tool-broker:      http://{url_host(self.host)}:{broker.port}\n"
            f"  NATS:             {redact(nats_url)}\n"
            + "".join(f"  {line}\n" for line in self.banner)
            + f"{admin}"
            "Press Ctrl-C to stop.\n",
            flush=True,
        )

    async def _is_ready(self, child: _Child) -> bool:
        """Our own child answers ready on its port, not some other program bound there."""
        spec, process = child.spec, child.process
        if process is None or process.returncode is not None:
            return False
        if await get_status(self.probe_host(spec), spec.port, spec.ready_path) != 200:
            return False
        return process.returncode is None and _listens(process.pid, spec.port)

    async def _bootstrap_admin(self, nats_url: str) -> str:
        """The banner's line about the admin key; a failure is said there, never dropped."""
        data_dir = self.settings.data_dir.resolve()
        path = data_dir / ADMIN_KEY_FILE
        nc = await connection.connect(nats_url, "suzumio-supervisor")
        try:
            key = await bootstrap_admin(nc, self.settings.topology(), data_dir)
        except AdminUnconfirmedError as exc:
            log.warning("up.admin_unconfirmed", reason=str(exc), key_file=str(path))
            return (
                f"  admin API key:    NOT CONFIRMED: {exc}. If the session service applies it"
                f" late,\n                    the key in {path} is the admin's;"
                " the next `suzumio up` sends it again.\n"
            )
        except (KeyFileError, CommandError) as exc:
            log.warning("up.admin_failed", reason=str(exc))
            return f"  admin API key:    NONE: {first_line(exc)}\n"
        finally:
            await nc.close()
        if key is not None:
            return f"  admin API key:    {key}\n                    (shown once; also in {path})\n"
        if path.exists():
            return f"  admin API key:    in {path}\n"
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


def _announce_failed(task: asyncio.Task[None]) -> None:
    if task.cancelled() or (exc := task.exception()) is None:
        return
    log.error("up.announce_failed", exc_info=exc)
    print(f"Suzumio could not finish starting: {first_line(exc)}", file=sys.stderr, flush=True)


def _listens(pid: int, port: int) -> bool:
    """Whether process `pid` holds a listening TCP socket on `port` (Linux /proc; elsewhere
    we cannot tell and say yes)."""
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return not Path("/proc/self/fd").exists()
    inodes = set()
    for fd in fds:
        with contextlib.suppress(OSError):
            target = str(fd.readlink())
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    for table in ("tcp", "tcp6"):
        try:
            rows = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            listening = len(cols) > 9 and cols[3] == "0A"  # TCP_LISTEN
            if listening and int(cols[1].rsplit(":", 1)[1], 16) == port and cols[9] in inodes:
                return True
    return False


def url_host(host: str) -> str:
    """`host` as a URL names it: an IPv6 address in brackets (`http://::1:8081` is no URL)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
