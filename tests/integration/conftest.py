"""Fixtures of the integration tests that several files share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest_asyncio
from nats.aio.client import Client as NATS

from suzumio.contracts.subjects import Topology
from suzumio.toolbroker.registry import ActivationRegistry


@pytest_asyncio.fixture
async def registry(nc: NATS, topology: Topology) -> AsyncIterator[ActivationRegistry]:
    """The tool-broker's activation registry, following the log from an hour back."""
    started = ActivationRegistry(nc, topology, timedelta(hours=1))
    await started.start()
    yield started
    await started.close()
