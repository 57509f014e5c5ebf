"""The nudge rule (DESIGN.md §6) against what the real runner records: it appends every turn's
assistant entry (one with only tool calls has no text), the signals it was given that are not
in the history yet (as user entries), every tool result (failed ones too) and its final entry,
all as the live activation's own entries. Only what it said (assistant text), a successful tool
call or its output text is a useful effect; the rest must not keep the nudge from firing."""

from __future__ import annotations

from suzumio.contracts.events import (
    ActivationCompleted,
    SessionMessageAppended,
    SignalRecorded,
    ToolCallFinished,
)
from suzumio.contracts.events.session import HistoryToolCall
from suzumio.contracts.values import Author, Priority, SignalKind
from suzumio.scheduler.domain import policy
from suzumio.scheduler.domain.world import World
from tests.unit.test_scheduling_state import Log, opened, signal, start


def entry(message_id: str, role: str, text: str, **extra: object) -> SessionMessageAppended:
    return SessionMessageAppended.model_validate(
        {
            "message_id": message_id,
            "author": Author(kind="agent", id="a"),
            "role": role,
            "text": text,
            "activation_id": "x1",
            **extra,
        }
    )


def given_work() -> tuple[World, Log]:
    world, log = opened()
    log.append("s", signal("m1"))
    custom = SignalRecorded(
        signal_id="c1", agent_id="a", kind=SignalKind.CUSTOM, priority=Priority.P3
    )
    log.append("s", custom)
    start(log, "x1", "m1", "c1")
    # The runner: the custom signal is not in the history yet, so it appends it (user entry).
    log.append("s", entry("e1", "user", "[signal custom] {}"))
    return world, log


def a_round_that_failed(log: Log) -> None:
    call = HistoryToolCall(id="call1", name="file.read", arguments='{"path": "x"}')
    log.append("s", entry("e2", "assistant", "", tool_calls=(call,)))
    log.append("x1", ToolCallFinished(call_id="call1", status="error", duration_ms=1))
    log.append("s", entry("e3", "tool", "error: no such file", tool_call_id="call1"))


def ended_nudged(world: World) -> bool:
    s = world.sessions["s"]
    assert s.last_ended is not None
    return policy.needs_nudge(s.last_ended)


def test_an_activation_that_said_and_did_nothing_is_nudged() -> None:
    world, log = given_work()
    a_round_that_failed(log)
    log.append("s", entry("e4", "assistant", "  "))  # the final entry: a blank answer
    log.append("x1", ActivationCompleted(text="  "))
    assert ended_nudged(world)


def test_an_answer_to_the_user_is_a_useful_effect() -> None:
    world, log = given_work()
    a_round_that_failed(log)
    log.append("s", entry("e4", "assistant", "The file does not exist."))
    log.append("x1", ActivationCompleted(text="The file does not exist."))
    assert not ended_nudged(world)


def test_what_it_said_along_a_tool_call_is_a_useful_effect() -> None:
    world, log = given_work()
    call = HistoryToolCall(id="call1", name="file.read", arguments="{}")
    log.append("s", entry("e2", "assistant", "Let me look.", tool_calls=(call,)))
    log.append("x1", ToolCallFinished(call_id="call1", status="error", duration_ms=1))
    log.append("x1", ActivationCompleted(text=""))
    assert not ended_nudged(world)


def test_a_successful_tool_call_is_a_useful_effect() -> None:
    world, log = given_work()
    log.append("x1", ToolCallFinished(call_id="call1", status="ok", duration_ms=1))
    log.append("s", entry("e2", "tool", "sent", tool_call_id="call1"))
    log.append("x1", ActivationCompleted(text=""))
    assert not ended_nudged(world)
