"""Figures of the tool-broker: one audited tool call's round trip, and a runner's streamed
tokens reaching an SSE client through the broker, LIVE and the gateway."""

from __future__ import annotations

import asyncio
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from suzumio.platform.tokens import TokenSigner
from suzumio.runner.broker import BrokerClient
from suzumio.runner.live import LiveStream
from tests.bench.gateway import percentiles
from tests.e2e.api import World, new_world
from tests.e2e.runner_env import request_activation
from tests.e2e.stack import Stack, running_stack

SERVICES = ("session", "scheduler", "toolbroker", "gateway")
AUDITED_CALLS = 2_000
TOKENS_PER_SECOND = 5_000
STREAM_SECONDS = 10.0


def _token(stack: Stack, world: World, activation_id: str) -> str:
    return TokenSigner([stack.secret_key]).issue(
        activation_id=activation_id,
        session_id=world.session_id,
        project_id=world.project_id,
        agent_id=world.agent_id,
        ttl=timedelta(minutes=30),
    )


async def _audit_figures(stack: Stack) -> dict[str, Any]:
    world = await new_world(stack, "audit")
    activation_id = await request_activation(stack, world)
    headers = {"Authorization": f"Bearer {_token(stack, world, activation_id)}"}
    digest = "0" * 64
    starts: list[float] = []
    pairs: list[float] = []
    async with httpx.AsyncClient(base_url=stack.url_of("toolbroker"), headers=headers) as c:
        for i in range(AUDITED_CALLS + 50):
            began = time.perf_counter()
            r = await c.post(
                "/runner/tool-calls/start",
                json={
                    "call_id": f"c{i}",
                    "tool": "file.read",
                    "arguments_digest": digest,
                    "arguments_size": 2,
                },
            )
            started = time.perf_counter()
            r.raise_for_status()
            f = await c.post(
                "/runner/tool-calls/finish",
                json={"call_id": f"c{i}", "status": "ok", "duration_ms": 1, "result_size": 10},
            )
            f.raise_for_status()
            if i >= 50:  # warm-up left out
                starts.append(started - began)
                pairs.append(time.perf_counter() - began)
    return {
        "calls": AUDITED_CALLS,
        "start_round_trip": percentiles(starts),
        "start_and_finish": percentiles(pairs),
        "targets": {"p50_ms": 5},
    }


async def _sse_reader(
    stack: Stack, world: World, ready: asyncio.Event, delays: list[float], stop: asyncio.Event
) -> None:
    url = urlsplit(stack.api)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    writer.write(
        (
            f"GET /v1/sessions/{world.session_id}/stream HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {world.key}\r\n\r\n"
        ).encode()
    )
    try:
        while not stop.is_set():
            line = await reader.readline()
            if not line:
                break
            if line.startswith(b"retry:"):
                ready.set()
            if line.startswith(b"data: ") and b'"kind":"text"' in line:
                now = time.time()
                chunk = orjson.loads(line[6:])
                delays.extend(now - float(t) for t in chunk["text"].split(";") if t)
    finally:
        writer.close()


async def _stream_figures(stack: Stack) -> dict[str, Any]:
    world = await new_world(stack, "stream")
    activation_id = await request_activation(stack, world)
    broker = BrokerClient(stack.url_of("toolbroker"), _token(stack, world, activation_id))
    live = LiveStream(broker)
    delays: list[float] = []
    ready, stop = asyncio.Event(), asyncio.Event()
    reader = asyncio.create_task(_sse_reader(stack, world, ready, delays, stop))
    await asyncio.wait_for(ready.wait(), 30)
    await asyncio.sleep(0.5)
    live.start()
    produced = 0
    per_tick, tick = 10, 10 / TOKENS_PER_SECOND  # ten tokens every 2 ms
    started = time.perf_counter()
    next_at = started
    while time.perf_counter() - started < STREAM_SECONDS:
        now = f"{time.time():.6f};"
        for _ in range(per_tick):
            live.text(now)  # a token is its own timestamp
        produced += per_tick
        next_at += tick
        await asyncio.sleep(max(next_at - time.perf_counter(), 0))
    elapsed = time.perf_counter() - started
    await live.close()
    await asyncio.sleep(2.0)
    stop.set()
    reader.cancel()
    await broker.aclose()
    return {
        "tokens_per_s_produced": round(produced / elapsed),
        "tokens_per_s_delivered": round(len(delays) / elapsed),
        "delivered_fraction": round(len(delays) / produced, 4),
        "broker_batches": live.chunks_sent,
        "added_latency": percentiles(delays) if delays else None,
        "targets": {"chunks_per_s": 5_000, "p99_added_latency_ms": 50},
    }


async def audit(nats_url: str, pg_url: str, root: Path) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(dir=root))
    async with running_stack(nats_url, pg_url, tmp, SERVICES) as stack:
        return await _audit_figures(stack)


async def runner_stream(nats_url: str, pg_url: str, root: Path) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(dir=root))
    async with running_stack(nats_url, pg_url, tmp, SERVICES) as stack:
        return await _stream_figures(stack)
