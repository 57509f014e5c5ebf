from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from suzumio.testing.model_server import ScriptedModelServer
from tests.e2e.stack import Stack, running_stack


@pytest_asyncio.fixture(scope="module")
async def stack(
    nats_url: str, postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with running_stack(nats_url, postgres_url, Path(tmp_path_factory.mktemp("stack"))) as s:
        yield s


PLATFORM_SERVICES = ("session", "scheduler", "toolbroker", "gateway")


@pytest_asyncio.fixture(scope="module")
async def platform(
    nats_url: str, postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    """The services an activation needs (session, scheduler, tool-broker, gateway)."""
    tmp = Path(tmp_path_factory.mktemp("platform"))
    async with running_stack(nats_url, postgres_url, tmp, PLATFORM_SERVICES) as s:
        yield s


@pytest_asyncio.fixture
async def model() -> AsyncIterator[ScriptedModelServer]:
    """A scripted OpenAI-compatible model server (the one fake the tests may use)."""
    async with ScriptedModelServer() as server:
        yield server


ALL_SERVICES = ("session", "scheduler", "orchestrator", "toolbroker", "gateway")


@pytest_asyncio.fixture(scope="module")
async def scripted_model() -> AsyncIterator[ScriptedModelServer]:
    """A scripted model server for a module's tests (each scripts its own model names)."""
    async with ScriptedModelServer() as server:
        yield server


@pytest_asyncio.fixture(scope="module")
async def everything_on_process(
    nats_url: str,
    postgres_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    scripted_model: ScriptedModelServer,
) -> AsyncIterator[Stack]:
    """Every service, the orchestrator launching on the process backend, its model calls
    answered by `scripted_model`."""
    env = {
        "SUZUMIO_MODEL_BASE_URL": f"{scripted_model.url}/v1",
        "SUZUMIO_MODEL_API_KEY": "sk-e2e-secret",
        "SUZUMIO_BACKENDS": '["process"]',
    }
    tmp = Path(tmp_path_factory.mktemp("everything"))
    async with running_stack(nats_url, postgres_url, tmp, ALL_SERVICES, env) as s:
        yield s
