"""Crash windows (review): a pool worker that dies after its runner recorded the activation's
output but before the worker reported the run's end (the runner shutting down, the worker
storing `out/`'s files). The work is done and its result is in the log; the activation must end
as that output says, not fail as lost — a retryable failure has the scheduler run the same
signals again: the agent does the work, and answers, twice.

Real services (session, scheduler, tool-broker, gateway), the real orchestrator engine in this
process, a real worker process (frozen with SIGSTOP at the moment the model is called, so its
runner goes on alone, then killed with SIGKILL once the output is in the log); the model is the
scripted one (the fake provider)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from suzumio.contracts.events import ActivationRequested
from suzumio.testing.model_server import Reply, ScriptedModelServer
from tests.backend_suite import TERMINAL, harness
from tests.e2e.conftest import PLATFORM_SERVICES, model  # noqa: F401 - fixtures
from tests.e2e.runner_env import post
from tests.e2e.stack import Stack, running_stack
from tests.e2e.test_backend_pool import pool_factory, workers  # noqa: F401 - fixture
from tests.support import eventually

HEARTBEAT_TIMEOUT = 5.0
RETRY_BACKOFF = 0.5  # the scheduler's first: a retry, were there one, comes soon


@pytest_asyncio.fixture(scope="module")
async def platform(
    nats_url: str, postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    tmp = Path(tmp_path_factory.mktemp("platform"))
    env = {"SUZUMIO_RETRY_BACKOFF_SECONDS": f"[{RETRY_BACKOFF}, 10, 60]"}
    async with running_stack(nats_url, postgres_url, tmp, PLATFORM_SERVICES, env) as s:
        yield s


async def requested(stack: Stack, session_id: str) -> list[str]:
    stream = await stack.store.load("session", session_id)
    return [e.data.activation_id for e in stream.events if isinstance(e.data, ActivationRequested)]


async def test_a_worker_killed_after_the_output_was_recorded_leaves_the_activation_completed(
    platform: Stack,
    model: ScriptedModelServer,  # noqa: F811
    tmp_path: Path,
    workers: list[subprocess.Popen[bytes]],  # noqa: F811
) -> None:
    factory = pool_factory(platform, tmp_path, workers, heartbeat_timeout=HEARTBEAT_TIMEOUT)
    async with harness(platform, model, tmp_path, factory, "pool") as h:
        world = await h.world("lateloss")
        model.script([Reply.text("the work is done", delay=1.5)])
        seen = len(model.requests)
        await post(platform, world, "do the work once")
        [activation_id] = await eventually(
            lambda: requested(platform, world.session_id), lambda ids: len(ids) == 1,
            timeout=30, what="the scheduler's request",
        )  # fmt: skip
        await eventually(
            lambda: asyncio.sleep(0, len(model.requests)), lambda n: n > seen,
            timeout=60, what="the runner calling the model",
        )  # fmt: skip
        [worker] = workers
        os.kill(worker.pid, signal.SIGSTOP)  # from here on the worker says nothing: as dead
        story = await eventually(
            lambda: h.story(activation_id),
            lambda types: "activation.output_recorded" in types or bool(set(types) & set(TERMINAL)),
            timeout=HEARTBEAT_TIMEOUT, what="the output in the log",
        )  # fmt: skip
        assert "activation.output_recorded" in story, story  # recorded before any end
        os.kill(worker.pid, signal.SIGKILL)
        os.kill(worker.pid, signal.SIGCONT)

        story = await h.ended(activation_id, timeout=60)
        stream = await platform.store.load("activation", activation_id)
        ended = stream.events[-1]
        assert [t for t in story if t in TERMINAL] == ["activation.completed"], (
            story,
            ended.data,
        )
        # ... and the work is not done again: no second activation for the same message.
        await asyncio.sleep(RETRY_BACKOFF * 4)  # past the scheduler's first retry backoff
        assert len(await requested(platform, world.session_id)) == 1
