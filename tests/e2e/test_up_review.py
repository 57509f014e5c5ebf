"""`suzumio up` under failure: a second `up` in the same data directory, a data directory it
cannot use, and an embedded server that dies while the platform runs."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from suzumio.platform.embedded.process import free_port, free_port_run
from suzumio.testing.processes import http_status
from tests.e2e.test_up import wait_for_line
from tests.e2e.test_up_failures import up_argv, up_env


def _supervisor_script(data_dir: Path) -> str:
    """A supervisor of one plain HTTP server, against servers it never needs to reach."""
    return textwrap.dedent(f"""
        from pathlib import Path
        from suzumio.cli.supervisor import ServiceSpec, Supervisor
        from suzumio.platform.settings import PlatformSettings
        settings = PlatformSettings(
            nats_url="nats://127.0.0.1:9", database_url="postgresql://x@127.0.0.1:9/x",
            data_dir=Path({str(data_dir)!r}),
        )
        port = {free_port()}
        args = ("--bind", "127.0.0.1", str(port))
        services = (ServiceSpec("fine", port, module="http.server", args=args),)
        raise SystemExit(Supervisor(settings, services=services).run())
    """)


async def test_a_second_up_in_the_same_data_directory_is_refused(tmp_path: Path) -> None:
    """Else it would borrow the first one's embedded servers and be left with none when the
    first one stops."""
    data = tmp_path / "data"
    out = tmp_path / "first.log"
    with out.open("wb") as log:
        first = subprocess.Popen(
            [sys.executable, "-c", _supervisor_script(data)],
            env=up_env(data), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        await wait_for_line(out, "supervisor.started", first, timeout=30)
        second = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-c", _supervisor_script(data)],
            env=up_env(data), capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert second.returncode == 1, second.stdout + second.stderr
        assert (
            f"another `suzumio up` (pid {first.pid}) runs with the data directory" in second.stderr
        )
        assert "supervisor.started" not in second.stderr  # nothing of it started
        assert first.poll() is None  # the first one is undisturbed
        first.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(first.wait, 30) == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()

    # Gone, however it went (SIGKILL too), it holds the directory no more.
    for name in ("killed", "after"):
        log_path = tmp_path / f"{name}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-c", _supervisor_script(data)],
                env=up_env(data), stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            await wait_for_line(log_path, "supervisor.started", proc, timeout=30)
        finally:
            proc.kill()
            proc.wait()


async def test_a_data_directory_it_cannot_use_is_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    data = tmp_path / "a-file" / "data"
    done = await asyncio.to_thread(
        subprocess.run, up_argv(free_port(), free_port(), free_port_run(4)),
        env=up_env(data), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert f"Cannot start Suzumio: the data directory {data} cannot be used" in done.stderr


async def _ready_again(port: int, up: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while await http_status(port, "/readyz") != 200:
        assert up.poll() is None
        assert time.monotonic() < deadline, "the gateway never became ready again"
        await asyncio.sleep(0.5)


async def test_an_embedded_server_that_dies_is_started_again(tmp_path: Path) -> None:
    api, broker, internal = free_port(), free_port(), free_port_run(4)
    out = tmp_path / "up.log"
    with out.open("wb") as log:
        up = subprocess.Popen(
            up_argv(api, broker, internal), env=up_env(tmp_path / "data"),
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        await wait_for_line(out, "Suzumio is up.", up, timeout=120)
        for name, marker in (("nats", "nats-server"), ("postgres", "postgres")):
            (server,) = [p for p in psutil.Process(up.pid).children() if marker in p.cmdline()[0]]
            server.kill()
            await wait_for_line(out, f"The embedded {name} server runs again", up, timeout=60)
            await asyncio.sleep(1)  # the services see it gone
            await _ready_again(api, up)
        up.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(up.wait, 30)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert code == 0, out.read_text()[-5000:]
