"""`suzumio up` when it cannot work: a port in use, a service that never starts; and `--host`
other than 127.0.0.1 (the demo model still binds loopback and is checked there)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from suzumio.platform.embedded.process import free_port, free_port_run
from suzumio.testing.servers import create_database, fresh_topology
from tests.e2e.test_up import wait_for_line


def up_env(data_dir: Path, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUZUMIO_")}
    return env | {"SUZUMIO_DATA_DIR": str(data_dir), "SUZUMIO_LOG_FORMAT": "json", **more}


def up_argv(api: int, broker: int, internal: int, *more: str) -> list[str]:
    ports = ["--api-port", str(api), "--broker-port", str(broker)]
    return [sys.executable, "-m", "suzumio.cli", "up", *ports,
            "--internal-ports-from", str(internal), *more]  # fmt: skip


async def test_a_port_in_use_stops_up_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        api = taken.getsockname()[1]
        done = await asyncio.to_thread(
            subprocess.run, up_argv(api, free_port(), free_port_run(4)),
            env=up_env(tmp_path / "data"), capture_output=True, text=True, timeout=30,
            check=False,
        )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"port {api} (gateway) on 127.0.0.1 is in use" in done.stderr
    assert not (tmp_path / "data" / "nats").exists()  # no embedded server was started


async def test_a_service_that_keeps_crashing_at_start_stops_everything(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        from pathlib import Path
        from suzumio.cli.supervisor import ServiceSpec, Supervisor
        from suzumio.platform.settings import PlatformSettings
        settings = PlatformSettings(
            nats_url="nats://127.0.0.1:9", database_url="postgresql://x@127.0.0.1:9/x",
            data_dir=Path({str(tmp_path)!r}),
        )
        services = (
            ServiceSpec("fine", {free_port()}, module="http.server",
                        args=("--bind", "127.0.0.1", "{free_port()}")),
            ServiceSpec("broken", {free_port()}, module="suzumio.no_such_service"),
        )
        raise SystemExit(Supervisor(settings, services=services, first_backoff=0.1).run())
    """)
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", script], env=up_env(tmp_path),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "broken exited (code 1) 3 times before it was ever ready" in done.stderr
    assert "No module named suzumio.no_such_service" in done.stderr  # its last lines


async def test_up_on_another_address_and_a_second_up_on_the_same_ports(
    tmp_path: Path, nats_url: str, postgres_url: str
) -> None:
    """127.0.0.2 is loopback too, but not 127.0.0.1 where the demo model listens."""
    api, broker, internal = free_port("127.0.0.2"), free_port("127.0.0.2"), free_port_run(4)
    env = up_env(
        tmp_path / "data",
        SUZUMIO_NATS_URL=nats_url,
        SUZUMIO_DATABASE_URL=await create_database(postgres_url),
        SUZUMIO_NAMESPACE=fresh_topology().namespace,
    )
    out = tmp_path / "up.log"
    with out.open("wb") as log:
        first = subprocess.Popen(
            up_argv(api, broker, internal, "--host", "127.0.0.2"),
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        await wait_for_line(out, "Suzumio is up.", first, timeout=90)
        assert f"http://127.0.0.2:{api}" in out.read_text()

        second = await asyncio.to_thread(
            subprocess.run, up_argv(api, broker, internal, "--host", "127.0.0.2"),
            env=up_env(tmp_path / "data2"), capture_output=True, text=True, timeout=30,
            check=False,
        )  # fmt: skip
        assert second.returncode == 1, second.stdout + second.stderr
        assert "is in use" in second.stderr
        assert "Suzumio is up" not in second.stdout
        assert first.poll() is None  # the first one is undisturbed

        first.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(first.wait, 30) == 0
    finally:
        if first.poll() is None:
            first.kill()
