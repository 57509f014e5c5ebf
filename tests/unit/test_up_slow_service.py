"""`up` with a service slow to get ready (a long rebuild, a slow disk): it said "still not ready"
and gave up on it for good — no admin key made, no banner, and the service never counted as
ready (three crashes hours later stopped the platform as if it had never started). It is
waited for still, and the platform announced once it answers. The services here are stand-ins
whose readiness the test decides: what is under test is the supervisor's waiting."""

from __future__ import annotations

import asyncio
import time

import pytest

from suzumio.cli.supervisor import ServiceSpec, Supervisor, _Child
from suzumio.platform.settings import PlatformSettings


async def test_a_service_slow_to_get_ready_is_waited_for_and_announced(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    specs = (ServiceSpec("toolbroker", 1), ServiceSpec("gateway", 2))
    supervisor = Supervisor(PlatformSettings(), services=specs, ready_timeout=0.3)
    for spec in specs:
        supervisor._children[spec.name] = _Child(spec)
    slow_until = time.monotonic() + 1.5

    async def is_ready(child: _Child) -> bool:
        return child.spec.name != "gateway" or time.monotonic() >= slow_until

    async def bootstrap_admin(nats_url: str) -> str:
        return "  admin key: (made)\n"

    monkeypatch.setattr(supervisor, "_is_ready", is_ready)
    monkeypatch.setattr(supervisor, "_bootstrap_admin", bootstrap_admin)
    await asyncio.wait_for(supervisor._announce("nats://127.0.0.1:4222"), 10)
    said = capsys.readouterr().out
    assert "Still not ready after 0s: gateway" in said
    assert "Suzumio is up." in said
    assert said.index("Still not ready") < said.index("Suzumio is up.")
    assert all(child.ready for child in supervisor._children.values())
