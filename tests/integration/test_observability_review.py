"""Observability against real NATS and Postgres: what `/metrics` says about the projection lag."""

from __future__ import annotations

import uuid

import httpx
import pytest
from nats.aio.client import Client as NATS
from starlette.applications import Starlette

from suzumio.contracts.subjects import Topology
from suzumio.platform import telemetry
from suzumio.platform.db.pool import Pool
from suzumio.platform.service import health
from suzumio.platform.service.health import Readiness

PROJECTION = "probe_projection"


async def _publish(nc: NATS, topology: Topology, count: int) -> None:
    js = nc.jetstream()
    for _ in range(count):
        await js.publish(topology.event_subject("probe", "p1"), b"{}")


def _lag_lines(text: str, gauge: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(gauge + "{")]


async def test_metrics_show_the_projection_lag_of_now_not_of_the_last_readyz(
    nc: NATS, pool: Pool, topology: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lag gauge read what the last `/readyz` had measured: under `suzumio up` (which asks
    `/readyz` only while starting) `/metrics` went on showing the lag of start-up while the
    projector fell behind, and, once Postgres was gone, a lag no one could know any more."""
    telemetry.setup_telemetry("probe", "probe-1")
    readiness = Readiness("probe", nc, pool, topology)
    # A name of this test's own: the runtime's gauge may be registered in this process already.
    gauge = f"suzumio_probe_lag_{uuid.uuid4().hex[:8]}"
    telemetry.meter.create_observable_gauge(gauge, callbacks=[readiness.observe_lag])
    await pool.execute(
        "INSERT INTO suzumio.projection_checkpoints (name, position, version, schema_name,"
        " serving) VALUES ($1, 0, 1, 'proj_probe', true)",
        PROJECTION,
    )
    await _publish(nc, topology, 2)
    _, report = await readiness.check()  # a readiness probe at start-up
    assert report["projection_lag"] == {PROJECTION: 2}

    await _publish(nc, topology, 3)  # the projector falls behind, nobody asks /readyz
    app = Starlette(routes=readiness.routes())
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://probe"
    ) as client:
        answer = await client.get("/metrics")
        assert answer.status_code == 200
        [line] = _lag_lines(answer.text, gauge)
        assert line.endswith(f'projection="{PROJECTION}"}} 5.0'), line

        await pool.close()  # Postgres gone: the lag cannot be known
        monkeypatch.setattr(health, "LAG_REFRESH_SECONDS", 0.0, raising=False)
        answer = await client.get("/metrics")
        assert answer.status_code == 200
        assert _lag_lines(answer.text, gauge) == []
