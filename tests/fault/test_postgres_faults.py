"""Postgres failing under the platform while activations run: every service's connections
terminated (`pg_terminate_backend`, the projector's, the leaders' locks, the gateway's pool),
eight times in about three seconds while the API is read and written, and then the Postgres
server itself restarted on its port. The services recover by themselves: every message the
client got a 201 for is done by exactly one completed activation (or closed as failed), every
activation ends in exactly one terminal state, nothing is in the log twice, the projector
catches up and its projections equal a rebuild, and the API reads them again; a request that
met a cut connection is answered 503 (send it again), never 500 and never dropped. All
services are real processes on the test NATS and a Postgres of this test's own (embedded, from
`suzumio.platform.embedded`); sandboxes run on the process backend; the model is the scripted
one (`suzumio.testing.model_server`, the fake provider)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest
import pytest_asyncio

from suzumio.platform.embedded import RunningServer, start_postgres
from tests.e2e.api import World, new_world, ok
from tests.e2e.stack import Stack
from tests.fault.faultkit import (
    ANSWER,
    Posted,
    all_ended,
    messages_kept,
    no_audit_twice,
    no_output_twice,
    one_end_each,
    platform_at_work,
    post_until_acknowledged,
    projections_equal_a_rebuild,
    requested,
    signals_settled,
    started,
    whole_log,
)
from tests.support import eventually

WORLDS = 3
CUTS = 8


class RestartablePostgres:
    """An embedded Postgres of this test's own (the session's shared one is not ours to
    restart), stopped and started again on its port and data directory."""

    def __init__(self, pgdata: Path) -> None:
        self.pgdata = pgdata
        self.server: RunningServer = start_postgres(pgdata, durable=False)
        self.url = self.server.url
        port = urlsplit(self.url).port
        assert port is not None
        self.port = port

    def restart(self) -> None:
        self.server.stop()  # fast shutdown: every connection is cut, transactions aborted
        self.server = start_postgres(self.pgdata, port=self.port, durable=False)
        assert self.server.url == self.url

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture
def postgres(tmp_path: Path) -> Iterator[RestartablePostgres]:
    server = RestartablePostgres(tmp_path / "pg" / "data")
    try:
        yield server
    finally:
        server.stop()


@pytest_asyncio.fixture
async def stack(
    nats_url: str, postgres: RestartablePostgres, tmp_path: Path
) -> AsyncIterator[Stack]:
    async with platform_at_work(nats_url, postgres.url, tmp_path / "stack", 2.0) as (s, _):
        yield s


async def terminate_connections(server_url: str, database_url: str) -> int:
    """Cut every connection to the platform's database; how many there were."""
    database = urlsplit(database_url).path.lstrip("/")
    conn = await asyncpg.connect(server_url)
    try:
        cut = await conn.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = $1 AND pid <> pg_backend_pid()",
            database,
        )
    finally:
        await conn.close()
    return len(cut)


async def keep_reading(stack: Stack, world: World, until: asyncio.Event) -> list[int]:
    """The API read over and over until `until` is set; the statuses it answered (0: none)."""
    statuses: list[int] = []
    async with stack.client(world.key) as c:
        while not until.is_set():
            try:
                answer = await c.get(f"/v1/sessions/{world.session_id}/messages")
            except httpx.TransportError:  # the gateway dropped the request without an answer
                statuses.append(0)
                continue
            statuses.append(answer.status_code)
    return statuses


async def post_wave(stack: Stack, worlds: list[World], wave: str, posted: Posted) -> None:
    for i, world in enumerate(worlds):
        await post_until_acknowledged(stack, world, f"{wave} {i}", posted)


@pytest.mark.timeout(240)
async def test_postgres_connections_cut_and_a_restart_lose_nothing(
    postgres: RestartablePostgres, stack: Stack
) -> None:
    worlds = [await new_world(stack, f"p{i}") for i in range(WORLDS)]
    posted = Posted()
    await post_wave(stack, worlds, "first", posted)
    await eventually(
        lambda: started(stack, worlds), lambda n: n >= 1, timeout=90, what="runs under way"
    )
    second = asyncio.create_task(post_wave(stack, worlds, "second", posted))
    cutting = asyncio.Event()
    reads = asyncio.create_task(keep_reading(stack, worlds[0], cutting))
    cut = [await terminate_connections(postgres.url, stack.database_url)]
    for _ in range(CUTS - 1):  # the services' connections cut while they work, again and again
        await asyncio.sleep(0.4)
        cut.append(await terminate_connections(postgres.url, stack.database_url))
    assert cut[0] > 0, cut  # (later rounds cut what was made again meanwhile, if anything)
    cutting.set()
    await second
    answers = await reads
    # A read that met a cut connection is trouble (503, ask again), never a failure (500).
    assert set(answers) <= {200, 503}, answers
    await asyncio.to_thread(postgres.restart)  # the server itself, while the second wave runs
    await post_wave(stack, worlds, "third", posted)
    assert not posted.unknown, posted

    signal_ids = [signal_id for _, signal_id in posted.acknowledged.values()]
    result = await signals_settled(stack, signal_ids, timeout=150)
    third = [posted.acknowledged[f"third {i}"][1] for i in range(WORLDS)]
    assert all(result.completed_deliveries(s) for s in third), "new work failed after the restart"
    ids = [a for world in worlds for a in await requested(stack, world)]
    one_end_each(await all_ended(stack, ids, timeout=60))
    envelopes = await whole_log(stack)
    messages_kept(envelopes, posted)
    no_output_twice(envelopes)
    no_audit_twice(envelopes)
    await projections_equal_a_rebuild(stack)
    for world in worlds:  # the API reads the projections again, all of it
        async with stack.client(world.key) as c:
            listed = ok(await c.get(f"/v1/sessions/{world.session_id}/messages?limit=200"))
        texts = [m["text"] for m in listed["items"]]
        assert {t for t in posted.acknowledged if t.endswith(f" {worlds.index(world)}")} <= set(
            texts
        ), texts
        assert ANSWER in texts, texts
