"""Liveness and readiness: `/healthz` says the process runs, `/readyz` that it can serve.

Ready means NATS is connected, Postgres answers, the streams exist and the projection lag is
known (the checkpoints can be read against the log's last sequence).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client as NATS
from opentelemetry.metrics import CallbackOptions, Observation
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from suzumio.contracts.subjects import Topology
from suzumio.platform import telemetry
from suzumio.platform.bus.jsapi import stream_state
from suzumio.platform.db.pool import Pool
from suzumio.platform.projections import checkpoints

LAG_REFRESH_SECONDS = 1.0  # `/metrics` measures the projection lag at most this often


@dataclass
class Readiness:
    service: str
    nc: NATS
    pool: Pool
    topology: Topology
    extra_checks: dict[str, Callable[[], bool]] = field(default_factory=dict)
    lag: dict[str, int] = field(default_factory=dict)
    draining: bool = False
    _lag_measured_at: float = field(default=float("-inf"), repr=False)

    async def check(self) -> tuple[bool, dict[str, Any]]:
        report: dict[str, Any] = {"service": self.service, "checks": {}}
        checks: dict[str, Any] = report["checks"]
        checks["draining"] = not self.draining
        checks["nats"] = self.nc.is_connected
        checks["postgres"] = await _ok(self.pool.fetchval("SELECT 1"))
        # Read before the log's end: a checkpoint read first is never past a log end read
        # after (the log only grows), so one that is past it says the log lost events.
        rows = await self._rows() if checks["postgres"] else None
        last_seq: int | None = None
        streams_ok = True
        for spec in self.topology.streams():
            try:
                state = await asyncio.wait_for(stream_state(self.nc, spec.name, timeout=2), 3)
            except Exception:
                streams_ok = False
                continue
            if spec.name == self.topology.events_stream:
                last_seq = int(state["last_seq"])
        checks["streams"] = streams_ok
        checks["projection_lag_known"] = False
        if last_seq is not None and rows:
            self.lag = _lag_of(rows, last_seq)
            # The read models past the log's end: the log is not the one they were built
            # from, or it lost its tail. Their lag reads 0, and the projector skipped every
            # new event up to them; it stops instead, and this says why.
            ahead = {name: cp.position for name, cp in rows.items() if cp.position > last_seq}
            checks["log_holds_checkpoints"] = not ahead
            if ahead:
                report["checkpoints_past_the_log"] = ahead
        else:
            self.lag = {}
        if self.lag:
            report["projection_lag"] = self.lag
            report["log_position"] = last_seq
            checks["projection_lag_known"] = True
        for name, probe in self.extra_checks.items():
            checks[name] = probe()
        return all(bool(v) for v in checks.values()), report

    async def refresh_lag(self) -> None:
        """Measure the projection lag now, for `/metrics`: without it the gauge would show
        the lag the last `/readyz` saw, however old (`suzumio up` asks `/readyz` only while
        starting), and go on showing it while the projector stands still. A lag that cannot
        be measured is shown as none, not as the last one measured. At most once a second:
        `/metrics` answers anyone who reaches the port (the gateway's is the API's)."""
        now = asyncio.get_running_loop().time()
        if now - self._lag_measured_at < LAG_REFRESH_SECONDS:
            return
        self._lag_measured_at = now
        if not self.nc.is_connected:  # known at once: no scrape waits out a request timeout
            self.lag = {}
            return
        try:
            state = await asyncio.wait_for(
                stream_state(self.nc, self.topology.events_stream, timeout=2), 3
            )
        except Exception:
            self.lag = {}
            return
        self.lag = await self._lag(int(state["last_seq"]))

    async def _lag(self, last_seq: int) -> dict[str, int]:
        rows = await self._rows()
        return _lag_of(rows, last_seq) if rows is not None else {}

    async def _rows(self) -> dict[str, checkpoints.Checkpoint] | None:
        try:
            return await asyncio.wait_for(checkpoints.read_all(self.pool), 3)
        except Exception:
            return None

    def observe_lag(self, _: CallbackOptions) -> list[Observation]:
        return [Observation(lag, {"projection": name}) for name, lag in self.lag.items()]

    def routes(self) -> list[Route]:
        async def healthz(_: Request) -> Response:
            return JSONResponse({"status": "ok", "service": self.service})

        async def readyz(_: Request) -> Response:
            ready, report = await self.check()
            report["ready"] = ready
            return JSONResponse(report, status_code=200 if ready else 503)

        async def metrics(_: Request) -> Response:
            await self.refresh_lag()
            return Response(telemetry.prometheus_text(), media_type=telemetry.METRICS_CONTENT_TYPE)

        return [
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ]


def _lag_of(rows: dict[str, checkpoints.Checkpoint], last_seq: int) -> dict[str, int]:
    return {name: max(last_seq - cp.position, 0) for name, cp in rows.items()}


async def _ok(awaitable: Any, timeout: float = 2.0) -> bool:
    try:
        await asyncio.wait_for(awaitable, timeout)
    except Exception:
        return False
    return True
