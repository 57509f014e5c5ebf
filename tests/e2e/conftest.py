from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.e2e.stack import Stack, running_stack


@pytest_asyncio.fixture(scope="module")
async def stack(
    nats_url: str, postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with running_stack(nats_url, postgres_url, Path(tmp_path_factory.mktemp("stack"))) as s:
        yield s
