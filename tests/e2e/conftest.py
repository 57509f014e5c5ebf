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
