"""The tool-broker's registry keeps an ended activation for its look-back (a day by default),
so that its token is refused as ended rather than unknown; the ids of its tool calls, which
no route reads once it is fenced, are dropped at its end — every replica would otherwise hold
those of every activation of the platform for that day."""

from __future__ import annotations

from datetime import timedelta
from typing import cast

import pytest
from nats.aio.client import Client as NATS

from suzumio.contracts.events import (
    ActivationCompleted,
    ActivationFailed,
    ActivationRequested,
    ToolCallFinished,
    ToolCallStarted,
)
from suzumio.contracts.subjects import DEFAULT_TOPOLOGY
from suzumio.toolbroker.registry import ActivationRegistry


@pytest.mark.parametrize("end", [ActivationCompleted(text="done"), ActivationFailed(reason="boom")])
def test_an_ended_activation_is_fenced_and_keeps_none_of_its_calls(end: object) -> None:
    registry = ActivationRegistry(cast("NATS", None), DEFAULT_TOPOLOGY, timedelta(hours=24))
    registry._apply("s1", ActivationRequested(activation_id="a1", agent_id="g", signal_ids=()))
    for n in range(50):
        started = ToolCallStarted(
            call_id=f"c{n}", tool="file.read", arguments_digest="0" * 64, arguments_size=2
        )
        registry._apply("a1", started)
        if n % 2:
            registry._apply("a1", ToolCallFinished(call_id=f"c{n}", status="ok", duration_ms=1))
    live = registry.get("a1")
    assert live is not None
    assert (len(live.calls_started), len(live.calls_finished), len(live.call_tools)) == (50, 25, 25)

    registry._apply("a1", end)
    ended = registry.get("a1")
    assert ended is not None
    assert ended.fenced == "ended"
    assert (ended.calls_started, ended.calls_finished, ended.call_tools) == (set(), set(), {})
