"""The CLI's commands other than `up`, as a person at a terminal meets them: a bad argument,
a server that is not what it should be or goes away mid-way, text from the API printed back.
Each ends in one line and an exit code, and changes nothing it should not."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.bus.jsapi import API_PREFIX, request
from suzumio.platform.db.pool import Pool
from suzumio.platform.embedded.process import free_port
from suzumio.platform.projections import load_projections
from suzumio.platform.projections.verify import verify
from tests.e2e.api import new_world
from tests.e2e.stack import Stack
from tests.integration.projector_support import caught_up, running_projector
from tests.scenario import Scenario, write
from tests.support import one_line_error


def environment(**settings: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SUZUMIO_")}
    return {**clean, "COLUMNS": "200", **settings}


def env_of(nats_url: str, database_url: str, topology: Topology) -> dict[str, str]:
    return {"SUZUMIO_NATS_URL": nats_url, "SUZUMIO_DATABASE_URL": database_url,
            "SUZUMIO_NAMESPACE": topology.namespace}  # fmt: skip


async def suzumio(*args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "suzumio.cli", *args],
        env=environment(**settings), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


async def snapshot(pool: Pool) -> dict[str, list[Any]]:
    """Every live projection table's rows, to see a rebuild changed nothing. (A staging
    schema an interrupted rebuild leaves is no one's: the next rebuild starts it afresh.)"""
    tables = await pool.fetch(
        "SELECT table_schema, table_name FROM information_schema.tables"
        " WHERE table_schema LIKE 'proj\\_%' AND table_schema NOT LIKE '%\\_\\_next'"
        " ORDER BY 1, 2"
    )
    return {
        f"{t['table_schema']}.{t['table_name']}": sorted(
            map(str, await pool.fetch(f'SELECT * FROM "{t["table_schema"]}"."{t["table_name"]}"'))
        )
        for t in tables
    }


@pytest_asyncio.fixture
async def projected(
    nc: NATS, store: EventStore, pool: Pool, database_url: str, topology: Topology
) -> int:
    """A log of a few hundred events, projected; the log's last sequence."""
    projections = load_projections()
    async with running_projector(nc, database_url, topology, store, projections):
        await write(store, Scenario(seed=5).appends(150))
        return await caught_up(nc, pool, topology, projections)


async def test_a_projection_named_twice_is_rebuilt_once(
    projected: int, nc: NATS, database_url: str, nats_url: str, topology: Topology
) -> None:
    # Before: replayed twice into one staging schema, then a traceback from the second swap.
    done = await suzumio(
        "projections", "rebuild", "sessions", "projects", "sessions",
        **env_of(nats_url, database_url, topology),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(f"sessions: rebuilt to position {projected}") == 1, done.stdout
    assert f"projects: rebuilt to position {projected}" in done.stdout
    assert "skipped" not in done.stdout
    assert all(r.equal for r in await verify(nc, database_url, topology, load_projections()))


async def test_an_unknown_projection_name_is_shown_as_typed() -> None:
    done = await suzumio("projections", "rebuild", "[/red]x")
    one_line_error(done, 2, "unknown projection(s): [/red]x", "sessions")


def _interruptible() -> None:
    """SIGINT as a terminal gives it, whatever this run inherited: a test run started in the
    background of a shell without job control ignores SIGINT, and so would the command (Python
    installs no KeyboardInterrupt for an ignored SIGINT): its Ctrl-C would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def _ended(proc: asyncio.subprocess.Process, stop: str) -> tuple[bytes, bytes]:
    """The command's output once it exited (within a minute of `stop`), or a failure with the
    stacks it hung in."""
    output = asyncio.ensure_future(proc.communicate())
    try:
        return await asyncio.wait_for(asyncio.shield(output), 60)
    except TimeoutError:
        proc.send_signal(signal.SIGABRT)
        _, err = await asyncio.wait_for(output, 30)
        stacks = err.decode(errors="replace")[-6000:]
        raise AssertionError(f"still running 60 s after the {stop}:\n{stacks}") from None


async def test_a_rebuild_cut_off_from_postgres_or_interrupted_leaves_the_live_tables(
    projected: int, pool: Pool, database_url: str, nats_url: str, topology: Topology
) -> None:
    before = await snapshot(pool)
    # A stack of every thread on SIGABRT: if the command ever hangs here, the failure says where.
    env = environment(**env_of(nats_url, database_url, topology)) | {"PYTHONFAULTHANDLER": "1"}
    for stop in ("connection cut", "Ctrl-C"):
        async with pool.acquire() as conn, conn.transaction():
            # The rebuild waits at its swap for the checkpoints, which this holds.
            await conn.execute("LOCK TABLE suzumio.projection_checkpoints IN EXCLUSIVE MODE")
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "suzumio.cli", "projections", "rebuild", env=env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                preexec_fn=_interruptible,
            )  # fmt: skip
            # In this test's database only: the server is the whole run's, and a rebuild some
            # other test left waiting elsewhere must not be the one cut off instead of ours.
            waiting = "SELECT pid FROM pg_stat_activity WHERE application_name = 'suzumio-rebuild'"
            waiting += " AND wait_event_type = 'Lock' AND datname = current_database()"
            for _ in range(300):
                if pid := await pool.fetchval(waiting):
                    break
                await asyncio.sleep(0.1)
            assert pid, "the rebuild never reached its swap"
            if stop == "Ctrl-C":
                proc.send_signal(signal.SIGINT)
            else:
                await pool.execute("SELECT pg_terminate_backend($1)", pid)
            out, err = await _ended(proc, stop)
        code = proc.returncode if proc.returncode is not None else -1
        done = subprocess.CompletedProcess("rebuild", code, out.decode(), err.decode())
        if stop == "Ctrl-C":
            assert done.returncode != 0
            assert "Traceback" not in done.stdout + done.stderr
        else:
            # Before: a traceback ending in asyncpg's InterfaceError.
            one_line_error(done, 1, "error: Postgres at", "connection")
        assert await snapshot(pool) == before, stop  # nothing half swapped in

    # Nothing is left locked either: the next rebuild goes through.
    again = await suzumio("projections", "rebuild", **env_of(nats_url, database_url, topology))
    assert again.returncode == 0, again.stdout + again.stderr
    assert await snapshot(pool) == before


async def test_commands_leave_the_existing_streams_as_they_are(
    nc: NATS, database_url: str, nats_url: str, topology: Topology
) -> None:
    """Run from a shell without the services' settings (here SUZUMIO_REPLICAS), a command used
    to bring the streams to its own: on a cluster, `status` would scale the event log from R3
    down to R1. (On this single server the same update is refused, with a traceback.)"""
    before = await request(nc, f"{API_PREFIX}.STREAM.INFO.{topology.events_stream}", None, 5)
    env = env_of(nats_url, database_url, topology)
    done = await suzumio("projections", "status", **env, SUZUMIO_REPLICAS="3")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "log position:" in done.stdout
    after = await request(nc, f"{API_PREFIX}.STREAM.INFO.{topology.events_stream}", None, 5)
    assert after["config"] == before["config"]


async def test_commands_still_make_the_streams_that_are_missing(
    nc: NATS, database_url: str, nats_url: str, topology: Topology
) -> None:
    fresh = Topology(namespace=f"{topology.namespace}x")
    done = await suzumio("projections", "status", **env_of(nats_url, database_url, fresh))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "log position: 0" in done.stdout
    for spec in fresh.streams():
        info = await request(nc, f"{API_PREFIX}.STREAM.INFO.{spec.name}", None, 5)
        assert info["config"]["subjects"] == list(spec.subjects)
        await request(nc, f"{API_PREFIX}.STREAM.DELETE.{spec.name}", None, 5)


@pytest.fixture
def nats_without_jetstream(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    binary = Path(sys.executable).parent / "nats-server"
    log = (tmp_path / "nats.log").open("w")
    server = subprocess.Popen(
        [str(binary), "-a", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log
    )
    try:
        yield f"nats://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(10)
        log.close()


async def test_a_nats_server_without_jetstream_is_named(
    nats_without_jetstream: str, database_url: str, topology: Topology
) -> None:
    # Before: ~25 s of retries, then a traceback ending in NoRespondersError.
    for args in (("projections", "status"), ("bootstrap-admin",)):
        done = await suzumio(*args, **env_of(nats_without_jetstream, database_url, topology))
        one_line_error(done, 1, f"NATS at {nats_without_jetstream}", "JetStream does not")


@pytest.mark.parametrize("data_dir", ["/dev/null/suzumio", "/proc/suzumio"])
async def test_a_data_directory_that_cannot_be_made_is_named(data_dir: str) -> None:
    # No URLs: the embedded servers' data directory is needed, and cannot be made there.
    done = await suzumio("projections", "status", SUZUMIO_DATA_DIR=data_dir)
    one_line_error(done, 1, f"embedded servers in {data_dir}")


# -- `suzumio agents import` against the running API ------------------------------------------


async def import_agent(
    stack: Stack, key: str, package: Path, project: str, **settings: str
) -> subprocess.CompletedProcess[str]:
    return await suzumio(
        "agents", "import", str(package), "--project", project,
        SUZUMIO_API_URL=stack.api, SUZUMIO_API_KEY=key, **settings,
    )  # fmt: skip


async def test_an_agent_name_is_printed_as_it_is(stack: Stack, tmp_path: Path) -> None:
    world = await new_world(stack, "names")
    for name in ("writer [beta]", "[/green] reviewer", "ünï 名前"):
        (tmp_path / "agent.yaml").write_text(f"name: {name!r}\nrole: r\nmodel: demo\n")
        # Before: `[beta]` vanished, and `[/green]` crashed the command after the agent was made.
        done = await import_agent(stack, world.key, tmp_path, world.project_id)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"agent {name} created: " in done.stdout, done.stdout


async def test_a_project_id_stays_one_path_segment_and_its_errors_are_shown(
    stack: Stack, tmp_path: Path
) -> None:
    world = await new_world(stack, "paths")
    (tmp_path / "agent.yaml").write_text("name: a\nrole: r\nmodel: demo\n")
    # Before: `x?y` posted to /v1/projects/x (405) and `a/../../x` to /v1/x/agents/import;
    # and a 422 said "the request is not valid" without saying what.
    for project in ("x?y", "ü"):
        done = await import_agent(stack, world.key, tmp_path, project)
        one_line_error(done, 1, "422", "project_id")
    done = await import_agent(stack, world.key, tmp_path, "a/../../x")
    assert done.returncode == 1
    assert "HTTP Request" not in done.stderr  # a command's requests are not logged, but
    done = await import_agent(
        stack, world.key, tmp_path, "a/../../x", SUZUMIO_LOG_LEVEL="debug"
    )  # with debug logs
    assert done.returncode == 1
    assert "/v1/projects/a%2F..%2F..%2Fx/agents/import" in done.stderr  # httpx's log line


async def test_a_password_in_the_api_url_is_not_echoed(tmp_path: Path) -> None:
    (tmp_path / "agent.yaml").write_text("name: a\nrole: r\nmodel: demo\n")
    api = f"http://proxy:hunter2@127.0.0.1:{free_port()}"  # nothing listens there
    done = await suzumio(
        "agents", "import", str(tmp_path), "--project", "p", "--api", api, SUZUMIO_API_KEY="k"
    )
    one_line_error(done, 1, "could not reach the API at http://proxy:***@127.0.0.1:")
    assert "hunter2" not in done.stdout + done.stderr


async def test_a_package_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    as_nobody: list[str] = []
    if os.geteuid() == 0:  # root reads anything: run the command as nobody
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        assert shutil.which("setpriv"), "util-linux's setpriv drops root for this test"
    package = Path(tempfile.mkdtemp())  # not under tmp_path: nobody must reach it
    try:
        package.chmod(0o755)
        (package / "agent.yaml").write_text("name: a\nrole: r\nmodel: demo\n")
        (package / "notes.md").write_text("private")
        (package / "notes.md").chmod(0)
        argv = [*as_nobody, sys.executable, "-m", "suzumio.cli", "agents", "import", str(package),
                "--project", "p", "--api", f"http://127.0.0.1:{free_port()}"]  # fmt: skip
        env = environment(SUZUMIO_API_KEY="k", SUZUMIO_DATA_DIR=str(package / "data"))
        done = await asyncio.to_thread(
            subprocess.run, argv, env=env, capture_output=True, text=True, timeout=60, check=False
        )
        bad_setup = "ModuleNotFoundError" in done.stderr or "Permission denied: '/" in done.stderr
        assert not bad_setup, f"nobody cannot run this checkout's Python: {done.stderr[:300]}"
        # Before: a traceback ending in PermissionError.
        one_line_error(done, 2, f"cannot pack {package}", str(package / "notes.md"))
    finally:
        shutil.rmtree(package)
