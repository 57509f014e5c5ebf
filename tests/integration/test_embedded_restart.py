"""The embedded servers survive an interrupted first start and clean up after themselves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import asyncpg

from suzumio.platform.embedded import EmbeddedServers, start_postgres
from suzumio.platform.embedded.postgres import _initdb, _system_user, postgres_bin_dir


async def can_connect(url: str) -> None:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        assert await conn.fetchval("SELECT current_database()") == "suzumio"
    finally:
        await conn.close()


async def test_a_first_start_stopped_after_initdb_still_starts(tmp_path: Path) -> None:
    pgdata = tmp_path / "postgres"
    pgdata.mkdir()
    _initdb(postgres_bin_dir(), pgdata, _system_user(pgdata), durable=False)  # then Ctrl-C

    server = start_postgres(pgdata, durable=False)
    try:
        await can_connect(server.url)
    finally:
        server.stop()
    again = start_postgres(pgdata, durable=False)  # and every later start, too
    try:
        await can_connect(again.url)
    finally:
        again.stop()


async def test_an_interrupted_initdb_is_redone(tmp_path: Path) -> None:
    pgdata = tmp_path / "postgres"
    pgdata.mkdir()  # what an earlier first start made before its initdb
    scratch = tmp_path / ".postgres.initdb"
    scratch.mkdir()
    (scratch / "half-written").write_text("initdb was stopped here")

    server = start_postgres(pgdata, durable=False)
    try:
        await can_connect(server.url)
    finally:
        server.stop()
    assert not scratch.exists()


def test_a_stale_nats_entry_is_not_borrowed_and_a_clean_stop_clears_the_state(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    state = data / "embedded.json"
    # A pid that is alive but no nats-server of ours (pids get reused), at a dead address.
    state.write_text(json.dumps({"nats": {"url": "nats://127.0.0.1:9", "pid": os.getpid()}}))

    servers = EmbeddedServers(data, durable=False).ensure(need_postgres=False)
    try:
        assert servers.nats is not None
        assert servers.nats.owned
        assert servers.nats.url != "nats://127.0.0.1:9"
        recorded = json.loads(state.read_text())["nats"]
        assert recorded["pid"] == servers.nats.pid
        borrowed = EmbeddedServers(data).ensure(need_postgres=False)  # a live one is borrowed
        assert borrowed.nats is not None
        assert (borrowed.nats.url, borrowed.nats.owned) == (servers.nats.url, False)
    finally:
        servers.stop()
    assert not state.exists()


def test_empty_urls_mean_the_embedded_servers(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUZUMIO_")}
    env |= {
        "SUZUMIO_NATS_URL": "",
        "SUZUMIO_DATABASE_URL": "",
        "SUZUMIO_DATA_DIR": str(tmp_path / "data"),
        "COLUMNS": "200",
    }
    done = subprocess.run(
        [sys.executable, "-m", "suzumio.cli", "projections", "status"],
        env=env, capture_output=True, text=True, timeout=100, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "log position: 0" in done.stdout
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "data" / "embedded.json").exists()  # cleared on the clean stop
