"""Figures of the service processes: resident memory when idle."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from suzumio.testing import servers
from suzumio.testing.processes import ServiceProcess

SERVICES = ("session", "scheduler", "orchestrator", "toolbroker", "gateway")
IDLE_SECONDS = 10


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


async def idle_rss(nats_url: str, pg_url: str, root: Path) -> dict[str, Any]:
    topology = servers.fresh_topology()
    dsn = await servers.create_database(pg_url)
    procs = [
        ServiceProcess(name, nats_url, dsn, topology, root / f"{name}.log").start()
        for name in SERVICES
    ]
    try:
        await asyncio.gather(*(p.wait_ready() for p in procs))
        await asyncio.sleep(IDLE_SECONDS)
        rss = {p.name: round(_rss_mb(p.process.pid), 1) for p in procs if p.process}
        await asyncio.gather(*(p.terminate() for p in procs))
    finally:
        for p in procs:
            if p.process and p.process.poll() is None:
                p.kill()
        await servers.drop_database(pg_url, dsn)
    return {"rss_mb": rss, "idle_seconds": IDLE_SECONDS, "target_mb_below": 150}
