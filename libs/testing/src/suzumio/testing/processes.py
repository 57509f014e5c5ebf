"""Service processes for tests that need real process boundaries (signals, kills)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suzumio.contracts.subjects import Topology
from suzumio.platform.embedded.process import child_setup, free_port
from suzumio.platform.service.probe import get, get_status


async def http_status(port: int, path: str, timeout: float = 2.0) -> int | None:
    return await get_status("127.0.0.1", port, path, timeout)


async def readiness(port: int, timeout: float = 2.0) -> tuple[int, dict[str, Any]] | None:
    """`GET /readyz`'s status and report, or None when nothing answered."""
    answer = await get("127.0.0.1", port, "/readyz", timeout)
    if answer is None:
        return None
    try:
        report = json.loads(answer[1])
    except ValueError:
        report = {}
    return answer[0], report if isinstance(report, dict) else {}


@dataclass
class ServiceProcess:
    """`python -m suzumio.<name>` against given servers, with its log in `log_path`."""

    name: str
    nats_url: str
    database_url: str
    topology: Topology
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> ServiceProcess:
        env = {
            **os.environ,
            "SUZUMIO_NATS_URL": self.nats_url,
            "SUZUMIO_DATABASE_URL": self.database_url,
            "SUZUMIO_NAMESPACE": self.topology.namespace,
            "SUZUMIO_HTTP_PORT": str(self.port),
            "SUZUMIO_LOG_FORMAT": "json",
            **self.env,
        }
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", f"suzumio.{self.name}"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=child_setup(signal.SIGKILL),  # noqa: PLW1509 - prctl, main thread
            )
        return self

    async def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            answer = await readiness(self.port)
            if answer is not None and answer[0] == 200:
                # Ready only if the answer is this service's: another server that took the
                # port first would answer while this one failed to bind it.
                if answer[1].get("service") != self.name:
                    raise AssertionError(
                        f"port {self.port} is served by {answer[1].get('service')!r}, "
                        f"not {self.name}:\n{self.log_path.read_text()[-4000:]}"
                    )
                return
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited early:\n{self.log_path.read_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} not ready:\n{self.log_path.read_text()[-4000:]}")
            await asyncio.sleep(0.1)

    async def terminate(self, timeout: float = 15.0) -> tuple[int, float]:
        """SIGTERM; the exit code and the seconds the process took to exit."""
        assert self.process is not None
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(self.process.wait, timeout)
        return code, time.monotonic() - started

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()
