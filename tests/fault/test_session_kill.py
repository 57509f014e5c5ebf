"""SIGKILL the session service (the aggregates' owner, host of the projector) twice while a
client posts messages through the API and activations run, restarting it each time: every
message the client got a 201 for is in the log once, one whose answer was lost is there at most
once (the client sends it again with its `Idempotency-Key`), every message is done by exactly
one completed activation or closed as failed, every activation ends in exactly one terminal
state, no activation's output is written twice, and the projections equal a rebuild. All
services are real processes on the test NATS and Postgres; sandboxes run on the process
backend; the model is the scripted one (`suzumio.testing.model_server`, the fake provider)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from suzumio.testing.model_server import ScriptedModelServer
from tests.e2e.api import World, new_world
from tests.e2e.stack import Stack
from tests.fault.faultkit import (
    Posted,
    done_once,
    platform_at_work,
    post_until_acknowledged,
    restart,
    service,
    started,
)
from tests.support import eventually

WORLDS = 3
PER_WORLD = 8
KILLS = 2


@pytest_asyncio.fixture
async def stack(
    nats_url: str, postgres_url: str, tmp_path: Path
) -> AsyncIterator[tuple[Stack, ScriptedModelServer]]:
    async with platform_at_work(nats_url, postgres_url, tmp_path, answer_delay=2.0) as s:
        yield s


async def keep_posting(stack: Stack, worlds: list[World], posted: Posted) -> None:
    """A message to each world in turn, a little apart, until each has `PER_WORLD`."""
    for n in range(PER_WORLD):
        for i, world in enumerate(worlds):
            await post_until_acknowledged(stack, world, f"m{i}-{n}", posted)
        await asyncio.sleep(0.1)


@pytest.mark.timeout(240)
async def test_a_session_service_killed_mid_run_loses_nothing_and_repeats_nothing(
    stack: tuple[Stack, ScriptedModelServer],
) -> None:
    platform, _ = stack
    worlds = [await new_world(platform, f"s{i}") for i in range(WORLDS)]
    posted = Posted()
    poster = asyncio.create_task(keep_posting(platform, worlds, posted))
    session = service(platform, "session")
    for kill in range(KILLS):
        await eventually(
            lambda k=kill: started(platform, worlds),  # type: ignore[misc]
            lambda n, k=kill: n >= k + 1,  # type: ignore[misc]
            timeout=90,
            what="runs under way",
        )
        session.kill()  # SIGKILL: mid-command, mid-batch of the projector
        await asyncio.sleep(1.0)
        await restart(session)
    await poster
    print(f"acknowledged {len(posted.acknowledged)}, made unseen {posted.made_unseen}")  # noqa: T201
    # A client that sends again, with its key, what got no clear answer learns every fate.
    assert posted.unknown == [], posted
    assert len(posted.acknowledged) + len(posted.made_unseen) == WORLDS * PER_WORLD

    await done_once(platform, worlds, posted)
