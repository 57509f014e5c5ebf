"""Figures of the public API: request latency under 100 concurrent clients, and SSE fan-out
of one session's live output to 100 subscribers."""

from __future__ import annotations

import asyncio
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from suzumio.contracts.live import LiveChunk
from tests.bench.http import Connection
from tests.e2e.api import new_world
from tests.e2e.stack import Stack, running_stack

CLIENTS = 100
SECONDS = 10.0
RATES = {"at_200_rps": 2.0, "at_500_rps": 5.0, "saturated": None}  # per client, 100 clients
FANOUT_SUBSCRIBERS = 100
CHUNKS_PER_SECOND = 5_000
BATCH_SECONDS = 0.01  # the broker forwards a runner's chunks in 10 ms batches


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pick(q: float) -> float:
        return ordered[min(int(q * len(ordered)), len(ordered) - 1)]

    return {
        "p50_ms": round(pick(0.5) * 1000, 2),
        "p99_ms": round(pick(0.99) * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
        "count": len(ordered),
    }


async def _clients(
    stack: Stack, key: str, method: str, paths: list[str], body: Any, rate: float | None
) -> tuple[list[float], int, float]:
    """`CLIENTS` connections in closed loops for `SECONDS`; latencies, errors, seconds."""
    url = urlsplit(stack.api)
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + SECONDS

    async def client(index: int) -> None:
        nonlocal errors
        conn = Connection(
            url.hostname or "127.0.0.1", url.port or 80, {"Authorization": f"Bearer {key}"}
        )
        await conn.open()
        interval = 1.0 / rate if rate else 0.0
        next_at = time.perf_counter() + interval * index / CLIENTS  # spread the starts
        try:
            while (now := time.perf_counter()) < deadline:
                if now < next_at:
                    await asyncio.sleep(next_at - now)
                started = time.perf_counter()
                status, _ = await conn.request(method, paths[index % len(paths)], body)
                latencies.append(time.perf_counter() - started)
                errors += status >= 400
                next_at += interval
        finally:
            await conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(CLIENTS)))
    return latencies, errors, time.perf_counter() - started


async def _latency_figures(stack: Stack) -> dict[str, Any]:
    world = await new_world(stack, "bench")
    sessions = [world.session_id]
    async with stack.client(world.key) as c:  # one session per client: 100 conversations
        for _ in range(CLIENTS - 1):
            created = await c.post(
                f"/v1/projects/{world.project_id}/sessions", json={"agent_id": world.agent_id}
            )
            sessions.append(created.json()["id"])
    figures: dict[str, Any] = {"clients": CLIENTS, "seconds": SECONDS}
    cases = {
        "get_session": ("GET", [f"/v1/sessions/{s}" for s in sessions], None),
        "post_message": ("POST", [f"/v1/sessions/{s}/messages" for s in sessions], {"text": "hi"}),
        "post_message_one_hot_session": (
            "POST",
            [f"/v1/sessions/{sessions[0]}/messages"],
            {"text": "hi"},
        ),
    }
    for name, (method, paths, body) in cases.items():
        for mode, rate in RATES.items():
            latencies, errors, seconds = await _clients(stack, world.key, method, paths, body, rate)
            figures[f"{name}_{mode}"] = {
                **percentiles(latencies),
                "errors": errors,
                "requests_per_s": round(len(latencies) / seconds),
            }
    figures["targets"] = {"get_p50_ms": 10, "get_p99_ms": 50, "post_message_p50_ms": 15}
    return figures


async def _subscriber(
    stack: Stack,
    key: str,
    session_id: str,
    ready: asyncio.Event,
    delays: list[float],
    stop: asyncio.Event,
) -> int:
    url = urlsplit(stack.api)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    writer.write(
        (
            f"GET /v1/sessions/{session_id}/stream HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {key}\r\n\r\n"
        ).encode()
    )
    received = 0
    try:
        while not stop.is_set():
            line = await reader.readline()
            if not line:
                break
            if line.startswith(b"retry:"):
                ready.set()
            if line.startswith(b"data: ") and b'"session_id"' in line and b'"chunks"' in line:
                now = time.time()
                chunk = orjson.loads(line[6:])  # fast: this loop's lag would count as latency
                for produced in chunk["data"]["chunks"]:
                    delays.append(now - produced)
                received += len(chunk["data"]["chunks"])
    finally:
        writer.close()
    return received


async def _fanout_figures(stack: Stack) -> dict[str, Any]:
    world = await new_world(stack, "fanout")
    delays: list[float] = []
    stop = asyncio.Event()
    readies = [asyncio.Event() for _ in range(FANOUT_SUBSCRIBERS)]
    subscribers = [
        asyncio.create_task(_subscriber(stack, world.key, world.session_id, r, delays, stop))
        for r in readies
    ]
    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 30)
    await asyncio.sleep(1.0)  # let every subscriber's consumers settle
    js = stack.nc.jetstream()
    subject = stack.topology.live_subject(world.session_id)
    per_batch = int(CHUNKS_PER_SECOND * BATCH_SECONDS)
    produced = 0
    started = time.perf_counter()
    next_at = started
    while time.perf_counter() - started < SECONDS:
        # Chunks were produced evenly over the last batch window; the batch leaves at its end.
        now = time.time()
        times = [now - BATCH_SECONDS * (1 - i / per_batch) for i in range(per_batch)]
        chunk = LiveChunk(
            session_id=world.session_id,
            activation_id="bench",
            kind="text",
            text="x" * per_batch,
            data={"chunks": times},
            at=datetime.now(UTC),
        )
        await js.publish(subject, chunk.model_dump_json().encode())
        produced += per_batch
        next_at += BATCH_SECONDS
        await asyncio.sleep(max(next_at - time.perf_counter(), 0))
    elapsed = time.perf_counter() - started
    await asyncio.sleep(2.0)
    stop.set()
    for task in subscribers:
        task.cancel()
    received = len(delays)
    return {
        "subscribers": FANOUT_SUBSCRIBERS,
        "chunks_per_s_produced": round(produced / elapsed),
        "chunks_per_s_delivered_per_subscriber": round(received / FANOUT_SUBSCRIBERS / elapsed),
        "delivered_fraction": round(received / (produced * FANOUT_SUBSCRIBERS), 4),
        "batch_window_ms": BATCH_SECONDS * 1000,
        "added_latency": percentiles(delays) if delays else None,
        "targets": {"chunks_per_s": 5_000, "p99_added_latency_ms": 50},
    }


async def api(nats_url: str, pg_url: str, root: Path) -> dict[str, Any]:
    async with running_stack(nats_url, pg_url, Path(tempfile.mkdtemp(dir=root))) as stack:
        return await _latency_figures(stack)


async def sse_fanout(nats_url: str, pg_url: str, root: Path) -> dict[str, Any]:
    # One user's key stands in for the session's hundred viewers: its cap on open streams
    # (`SUZUMIO_STREAM_MAX_PER_USER`, 32) is raised to let it hold them all.
    cap = {"SUZUMIO_STREAM_MAX_PER_USER": str(FANOUT_SUBSCRIBERS)}
    async with running_stack(
        nats_url, pg_url, Path(tempfile.mkdtemp(dir=root)), extra_env=cap
    ) as stack:
        return await _fanout_figures(stack)
