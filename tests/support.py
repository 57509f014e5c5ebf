"""Small helpers shared by tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import structlog
from starlette.types import ASGIApp

from suzumio.contracts.envelope import DomainEvent, RecordedEvent
from suzumio.contracts.subjects import Topology
from suzumio.platform import logging as platform_logging
from suzumio.platform.bus.eventstore import EventStore, Head
from suzumio.platform.service.runtime import ServiceRuntime
from suzumio.platform.settings import ServiceSettings

T = TypeVar("T")


def policy_for(chosen: str) -> int:
    """The policy a process started from this one ends under when told `chosen` (batch or
    inherit): this process's own (tests may run under `chrt`), batch in place of the default."""
    started = os.sched_getscheduler(0) & ~os.SCHED_RESET_ON_FORK  # children lose the flag
    return os.SCHED_BATCH if chosen == "batch" and started == os.SCHED_OTHER else started


def cpu_policies(pid: int) -> set[int]:
    """The scheduling policies of a process's threads (`os.SCHED_*`); none for a process that
    is gone."""
    found: set[int] = set()
    with contextlib.suppress(FileNotFoundError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                found.add(os.sched_getscheduler(int(task.name)))
    return found


async def eventually(
    probe: Callable[[], Awaitable[T]],
    until: Callable[[T], bool],
    *,
    timeout: float = 10.0,
    what: str = "condition",
) -> T:
    """Poll `probe` until `until(result)` holds; fail with the last result after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        result = await probe()
        if until(result):
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last value: {result!r}")
        await asyncio.sleep(0.02)


def start_pool_worker(
    nats_url: str, namespace: str, workdir: Path, log: Path, *options: str
) -> subprocess.Popen[bytes]:
    """`python -m suzumio.runner worker` on the test's NATS and namespace, its output in `log`;
    `options` are more of the worker's flags (`--concurrency 2`, `--heartbeat 1`, …)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "suzumio.runner", "worker", "--nats", nats_url,
             "--namespace", namespace, "--workdir", str(workdir), *options],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def configure_logging_uncached(service: str, **options: Any) -> None:
    """The platform's logging set-up without caching loggers, for tests that capture it: a
    logger used meanwhile would keep writing to the test's captured stderr, closed once the
    test ends, and every later test using it would fail."""
    platform_logging.configure_logging(service, **options)
    structlog.configure(cache_logger_on_first_use=False)


def one_line_error(done: subprocess.CompletedProcess[str], code: int, *expected: str) -> None:
    """A CLI command failed with `code` and said so in one line (no traceback), naming each of
    `expected`; log records beside it (httpx logs each request) do not count as lines."""
    output = done.stdout + done.stderr
    assert done.returncode == code, output
    assert "Traceback" not in output, output
    said = [line for line in output.splitlines() if line and not line.startswith('{"event"')]
    assert len(said) == 1, output
    for text in expected:
        assert text in output, output


def make_certificate(folder: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for the DNS name `name` and its key (PEM files in `folder`);
    the test is skipped where openssl is missing."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            f"/CN={name}",
            "-addext",
            f"subjectAltName=DNS:{name}",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return cert, key


@contextlib.asynccontextmanager
async def serving(
    app: ASGIApp, tmp_path: Path, nats_url: str, database_url: str, topology: Topology
) -> AsyncIterator[int]:
    """`app` served by a service runtime as every service's HTTP is (`ServiceRuntime.serve`):
    its port, once bound (uvicorn may take a moment more to listen); stopped at the end."""
    settings = ServiceSettings(namespace=topology.namespace, data_dir=tmp_path / "data")
    runtime = ServiceRuntime("probe", settings, nats_url=nats_url, database_url=database_url)
    stop = asyncio.Event()
    running: asyncio.Task[None] | None = None
    try:
        await runtime.open()
        running = asyncio.create_task(runtime.serve(app, stop))
        while runtime.http_port is None:
            await asyncio.sleep(0.01)
        yield runtime.http_port
    finally:
        stop.set()
        if running is not None:
            await running
        await runtime.close()


class ReadsBehind(EventStore):
    """Reads as a follower of a replicated log one write behind would: without an aggregate's
    last event — of `aggregates` (all when None), `behind` times (for good when None) —
    unless asked for a replica holding the log up to a position (`min_last_seq`)."""

    def __init__(
        self, *args: Any, aggregates: set[str] | None = None, behind: int | None = None
    ) -> None:
        super().__init__(*args)
        self.aggregates = aggregates
        self.behind = behind
        self.behind_reads = 0

    async def events(
        self,
        aggregate: str,
        aggregate_id: str,
        *,
        after: Head | None = None,
        min_last_seq: int = 0,
    ) -> AsyncIterator[RecordedEvent[DomainEvent]]:
        held = [
            e
            async for e in super().events(
                aggregate, aggregate_id, after=after, min_last_seq=min_last_seq
            )
        ]
        chosen = self.aggregates is None or aggregate in self.aggregates
        if chosen and held and not min_last_seq and self.behind != 0:
            self.behind_reads += 1
            if self.behind is not None:
                self.behind -= 1
            held.pop()
        for event in held:
            yield event
