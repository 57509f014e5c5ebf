"""A leader's lock connection that its server ended mid-statement can fail with asyncpg's
InternalClientError ("another operation is in progress") before asyncpg sees it closed. That
is the server's trouble: the contender must try again, not end — the orchestrator's whole
service stopped on it when Postgres's connections were cut (tests/fault/test_postgres_faults.py).
The connection here is a stand-in that fails so; the rest is the real `Leadership`."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from suzumio.platform.db import leadership
from suzumio.platform.db.leadership import Leadership


class CutConnection:
    """Takes the lock, then fails the heartbeat as a connection cut mid-statement does."""

    def __init__(self) -> None:
        self.closed = False

    async def fetchval(self, query: str, *_: Any) -> Any:
        if "advisory_lock" in query:
            return True
        raise asyncpg.InternalClientError(
            "cannot switch to state 11; another operation (2) is in progress"
        )

    async def close(self) -> None:
        self.closed = True


async def test_a_lock_connection_failing_mid_statement_is_contended_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    connections: list[CutConnection] = []

    async def connect(*_: Any) -> CutConnection:
        connections.append(CutConnection())
        return connections[-1]

    monkeypatch.setattr(leadership, "connect", connect)
    terms = 0
    stop = asyncio.Event()

    async def lead(done: asyncio.Event) -> None:
        nonlocal terms
        terms += 1
        if terms >= 2:  # led again after the failure: enough
            stop.set()
        await done.wait()

    contender = Leadership("postgresql://unused", "t", retry_seconds=0.01, heartbeat_seconds=0.02)
    await asyncio.wait_for(contender.run(stop, lead), 10)
    assert terms >= 2
    assert all(c.closed for c in connections)
