"""`make bench`: measure the figures of DESIGN.md / the issues and print them as JSON.

Runs against real servers started here (embedded NATS, a durable embedded Postgres) in a
temporary directory; each figure is measured on a fresh namespace and database. Progress goes
to stderr, the JSON document to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvloop

from suzumio.platform.embedded import start_nats, start_postgres
from suzumio.platform.logging import configure_logging
from suzumio.platform.service import cpu
from suzumio.platform.settings import PlatformSettings
from tests.bench import broker, eventlog, gateway, orchestration, runner_tools, scheduler, services

Section = Callable[[str, str, Path], Awaitable[dict[str, Any]]]
SECTIONS: dict[str, Section] = {
    "event_append": eventlog.appends,
    "projector": eventlog.projector,
    "rebuild": eventlog.rebuild_100k,
    "gateway_latency": gateway.api,
    "sse_fanout": gateway.sse_fanout,
    "scheduling": scheduler.scheduling,
    "broker_audit": broker.audit,
    "runner_stream": broker.runner_stream,
    "runner_tools": runner_tools.html_conversion,
    "backends": orchestration.backends,
    "idle_rss": services.idle_rss,
}


def main() -> int:
    configure_logging("bench", level="warning", fmt="console")  # stdout is for the JSON only
    parser = argparse.ArgumentParser(prog="make bench")
    parser.add_argument("sections", nargs="*", help=f"some of: {', '.join(SECTIONS)}")
    args = parser.parse_args()
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    args.sections = args.sections or list(SECTIONS)
    with tempfile.TemporaryDirectory(prefix="suzumio-bench-") as tmp:
        root = Path(tmp)
        # As `make up` runs the platform: its servers, and the parts of the services this
        # process runs in it (the event store's appends, the projector, the orchestrator of
        # the backends' figures), under the CPU policy of the platform's processes.
        if why_not := cpu.apply(PlatformSettings().cpu_policy):
            print(f"bench: cpu_policy_unchanged: {why_not}", file=sys.stderr)
        nats = start_nats(root / "nats")
        # Where the throughput figures read the messages each connection sent and received.
        os.environ["SUZUMIO_BENCH_NATS_MONITORING"] = nats.extra.get("monitoring", "")
        postgres = start_postgres(root / "pg", durable=True)
        try:
            results = _run(nats.url, postgres.url, root, args.sections)
        finally:
            nats.stop()
            postgres.stop()
    report = {
        "machine": {"cpus": _cpus(), "python": platform.python_version()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **results,
    }
    print(json.dumps(report, indent=2))
    return 0


def _run(nats_url: str, pg_url: str, root: Path, sections: list[str]) -> dict[str, Any]:
    async def run_all() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in sections:
            print(f"bench: {name} ...", file=sys.stderr, flush=True)
            out[name] = await SECTIONS[name](nats_url, pg_url, root)
        return out

    return uvloop.run(run_all())


def _cpus() -> int:
    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    sys.exit(main())
