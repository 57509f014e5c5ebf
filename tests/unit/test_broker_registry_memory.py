"""The tool-broker's registry keeps an ended activation for its look-back (a day by default),
so that its token is refused as ended rather than unknown; the ids of its tool calls, which
no route reads once it is fenced, are dropped at its end — every replica would otherwise hold
those of every activation of the platform for that day."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
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
from suzumio.platform.bus.eventstore import EventStore
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


class _Stream:
    def __init__(self, events: list[object]) -> None:
        self.events = [
            SimpleNamespace(envelope=SimpleNamespace(type=type(e).event_type), data=e)  # type: ignore[attr-defined]
            for e in events
        ]
        self.version, self.seq = len(events), len(events)


class _Subjects:
    """A store holding a session's subject and an activation's, for a recall to read."""

    def __init__(self, session: list[object]) -> None:
        self._session = session

    async def load(self, aggregate: str, aggregate_id: str, **_: object) -> _Stream:
        return _Stream(self._session if aggregate == "session" else [])


async def test_recalling_an_old_attempt_fences_it_not_the_sessions_live_activation() -> None:
    """A's sandbox lives on after its end; this replica, restarted, never folded A's request
    and recalls it from the session's subject when A calls. B, requested after A (and folded
    live), stays live; A is fenced as superseded — not the other way round."""
    registry = ActivationRegistry(cast("NATS", None), DEFAULT_TOPOLOGY, timedelta(hours=24))
    older = ActivationRequested(activation_id="A", agent_id="g", signal_ids=())
    newer = ActivationRequested(activation_id="B", agent_id="g", signal_ids=())
    registry._apply("s1", newer)  # folded live
    store = _Subjects([older, newer])
    await registry.recall(cast("EventStore", store), "A", "s1")
    a, b = registry.get("A"), registry.get("B")
    assert a is not None
    assert b is not None
    assert b.fenced == ""
    assert a.fenced.startswith("over")
