"""A pool worker whose NATS does not answer waits for it, one line of its log per attempt,
and still ends on SIGTERM. The worker a process; nothing listens on the port it is given."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
from pathlib import Path

from tests.support import eventually, start_pool_worker


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def events(log: Path) -> list[str]:
    found = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            found.append(json.loads(line)["event"])
        except (ValueError, KeyError, TypeError):
            found.append(f"not a log line: {line}")
    return found


async def test_a_worker_waiting_for_nats_logs_one_line_an_attempt_and_ends_on_sigterm(
    tmp_path: Path,
) -> None:
    log = tmp_path / "worker.log"
    url = f"nats://127.0.0.1:{closed_port()}"
    proc = start_pool_worker(url, "t", tmp_path / "w", log)
    try:
        await eventually(
            lambda: asyncio.sleep(0, events(log)),
            lambda seen: seen.count("worker.nats_error") >= 2,
            timeout=30,
            what="two failed attempts logged",
        )
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0
    seen = events(log)
    assert not [e for e in seen if e.startswith("not a log line")], seen  # no tracebacks
    assert seen[-1] == "worker.stopped"
