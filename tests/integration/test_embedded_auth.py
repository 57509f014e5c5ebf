"""The embedded servers let in only who holds their secrets, and nothing prints those secrets.

Sandboxes may share the host's network, so loopback alone keeps nobody out: Postgres wants the
superuser's password, NATS a token, both kept 0600 in the data directory. The file names are
part of the layout a person (or a backup) relies on, so they are spelt out here.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

import asyncpg
import nats
import psutil
import pytest
from nats import errors as nats_errors

from suzumio.platform.embedded import EmbeddedServers, start_nats, start_postgres
from suzumio.platform.embedded.postgres import _initdb, _system_user, postgres_bin_dir
from suzumio.platform.embedded.process import free_port, free_port_run, wait_until

PASSWORD_FILE = "suzumio-password"  # in the Postgres data directory
TOKEN_FILE = "suzumio-token"  # in the NATS store directory


def without_credentials(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]))


def bare(url: str) -> str:
    """`url` as someone without the password would try it: the user alone."""
    return without_credentials(url).replace("://", "://postgres@")


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


async def refused_by_postgres(url: str) -> bool:
    try:
        conn = await asyncpg.connect(url, timeout=10)
    except asyncpg.InvalidPasswordError:
        return True
    await conn.close()
    return False


@pytest.fixture(autouse=True)
def no_ambient_password(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A password from the environment or ~/.pgpass would let a bare URL in by other means."""
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-pgpass"))


async def test_postgres_refuses_a_connection_without_the_password(tmp_path: Path) -> None:
    pgdata = tmp_path / "postgres"
    server = start_postgres(pgdata, durable=False)
    try:
        assert await refused_by_postgres(bare(server.url))
        password = (pgdata / PASSWORD_FILE).read_text().strip()
        assert unquote(urlsplit(server.url).password or "") == password
        assert len(password) >= 32
        assert await refused_by_postgres(server.url.replace(password, "guess"))
        conn = await asyncpg.connect(server.url, timeout=10)
        await conn.close()
    finally:
        server.stop()
    assert mode(pgdata / PASSWORD_FILE) == 0o600
    hba = (pgdata / "pg_hba.conf").read_text()
    assert not [line for line in hba.splitlines() if "trust" in line.split("#")[0]]


async def test_nats_refuses_a_client_without_the_token(tmp_path: Path) -> None:
    server = start_nats(tmp_path / "nats")
    try:
        for url in (without_credentials(server.url), server.url.replace("://", "://guess")):
            with pytest.raises((nats_errors.Error, OSError)):
                await nats.connect(url, allow_reconnect=False, connect_timeout=3)
        nc = await nats.connect(server.url, allow_reconnect=False, connect_timeout=3)
        await nc.jetstream().account_info()  # JetStream too, with the token
        await nc.close()
        monitoring = urlsplit(server.extra["monitoring"]).hostname
        assert monitoring == "127.0.0.1"  # read-only HTTP, and on loopback only
    finally:
        server.stop()
    token = (tmp_path / "nats" / TOKEN_FILE).read_text().strip()
    assert urlsplit(server.url).username == token  # nats://TOKEN@host:port
    assert mode(tmp_path / "nats" / TOKEN_FILE) == 0o600
    assert mode(tmp_path / "nats" / "nats-server.conf") == 0o600  # the token is in it, too


def test_the_state_file_is_private_and_holds_no_secret(tmp_path: Path) -> None:
    data = tmp_path / "data"
    servers = EmbeddedServers(data, durable=False).ensure()
    try:
        assert servers.nats is not None
        assert servers.postgres is not None
        state = (data / "embedded.json").read_text()
        assert mode(data / "embedded.json") == 0o600
        token = (data / "nats" / TOKEN_FILE).read_text().strip()
        password = (data / "postgres" / PASSWORD_FILE).read_text().strip()
        assert token not in state
        assert password not in state
        assert json.loads(state)["nats"]["url"].startswith("nats://***@127.0.0.1:")
        borrowed = EmbeddedServers(data).ensure(need_postgres=False)  # reads the token back
        assert borrowed.nats is not None
        assert borrowed.nats.url == servers.nats.url
        assert "http:" not in (data / "nats" / "nats-server.conf").read_text()  # no monitoring
    finally:
        servers.stop()


@asynccontextmanager
async def trusting_postgres(pgdata: Path) -> AsyncIterator[str]:
    """A Postgres as earlier versions ran it: `--auth=trust`, no password. Its URL."""
    pgdata.mkdir()
    user = _system_user(pgdata)
    _initdb(postgres_bin_dir(), pgdata, user, durable=False)
    port = free_port()
    argv = [str(postgres_bin_dir() / "postgres"), "-D", str(pgdata), "-p", str(port),
            "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="]  # fmt: skip
    process = subprocess.Popen(argv, user=user, stderr=subprocess.DEVNULL)
    try:
        ready = pgdata / "postmaster.pid"
        wait_until(lambda: "ready" in ready.read_text() if ready.exists() else False,
                   timeout=30, what="postgres")  # fmt: skip
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(30)


async def keep_a_row(url: str) -> None:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        await conn.execute("CREATE DATABASE suzumio")
    finally:
        await conn.close()
    conn = await asyncpg.connect(url.rsplit("/", 1)[0] + "/suzumio", timeout=10)
    try:
        await conn.execute("CREATE TABLE kept (note text); INSERT INTO kept VALUES ('still here')")
    finally:
        await conn.close()


async def still_kept(url: str) -> None:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        assert await conn.fetchval("SELECT note FROM kept") == "still here"
    finally:
        await conn.close()


async def test_a_trust_directory_is_locked_on_start_and_keeps_its_data(tmp_path: Path) -> None:
    pgdata = tmp_path / "postgres"
    async with trusting_postgres(pgdata) as old:
        await keep_a_row(old)

    server = start_postgres(pgdata, durable=False)
    try:
        assert await refused_by_postgres(bare(server.url))
        await still_kept(server.url)
    finally:
        server.stop()
    assert mode(pgdata / PASSWORD_FILE) == 0o600


async def test_a_running_trust_server_is_locked_when_borrowed(tmp_path: Path) -> None:
    pgdata = tmp_path / "postgres"
    async with trusting_postgres(pgdata) as old:
        await keep_a_row(old)
        borrowed = start_postgres(pgdata, durable=False)
        assert not borrowed.owned
        await still_kept(borrowed.url)
        deadline = asyncio.get_running_loop().time() + 10
        while not await refused_by_postgres(old):  # it rereads pg_hba.conf on SIGHUP
            assert asyncio.get_running_loop().time() < deadline, "still trusts"
            await asyncio.sleep(0.2)


async def test_cli_errors_mask_the_nats_token() -> None:
    url = f"nats://sekrit-token@127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUZUMIO_")}
    env |= {"SUZUMIO_NATS_URL": url, "SUZUMIO_DATABASE_URL": "postgresql://x:hunter2@h/d"}
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "suzumio.cli", "projections", "status"],
        env=env, capture_output=True, text=True, timeout=40, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "nats://***@127.0.0.1" in output, output
    assert "sekrit-token" not in output
    assert "hunter2" not in output


async def wait_for_line(path: Path, text: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while text not in path.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(path.read_text(errors="replace")[-5000:])
        await asyncio.sleep(0.2)


async def test_up_shows_no_secret(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUZUMIO_")}
    env |= {"SUZUMIO_DATA_DIR": str(data), "SUZUMIO_LOG_FORMAT": "json"}
    out = tmp_path / "up.log"
    with out.open("wb") as log:
        up = subprocess.Popen(
            [sys.executable, "-m", "suzumio.cli", "up", "--api-port", str(free_port()),
             "--broker-port", str(free_port()), "--internal-ports-from", str(free_port_run(4))],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        await wait_for_line(out, "Suzumio is up.", up)
        assert "NATS:             nats://***@127.0.0.1:" in out.read_text()
        secrets = [
            (data / "nats" / TOKEN_FILE).read_text().strip(),
            (data / "postgres" / PASSWORD_FILE).read_text().strip(),
        ]
        argvs = [" ".join(p.cmdline()) for p in psutil.Process(up.pid).children(recursive=True)]
        up.send_signal(signal.SIGTERM)
        await asyncio.to_thread(up.wait, 30)
    finally:
        if up.poll() is None:
            up.kill()
    shown = out.read_text()
    for secret in secrets:
        assert secret not in shown
        assert not [argv for argv in argvs if secret in argv]  # `ps` shows argv to everyone
