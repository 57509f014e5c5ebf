"""Each hook action of a review is sent on its own: one the commands refuse (a payload too
large, a time before 2000) is logged and skipped, and the other actions, other hooks' too, are
still sent; a timezone-naive `not_before` from a hook is read as UTC, not refused."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import cast

import pytest
from nats.aio.client import Client as NATS

from suzumio.contracts.commands import Command, PostMessage, RecordSignal
from suzumio.contracts.errors import InvalidError
from suzumio.contracts.scheduling import (
    AgentSchedulingState,
    HookAction,
    HookMessage,
    HookSignal,
    SchedulerHook,
)
from suzumio.contracts.subjects import DEFAULT_TOPOLOGY
from suzumio.contracts.values import MAX_PAYLOAD_BYTES, SignalKind
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.eventstore import EventStore
from suzumio.scheduler.domain.model import Ended, SessionSchedule
from suzumio.scheduler.engine import Scheduler
from suzumio.scheduler.hooks import Hooks, NamedHook
from suzumio.scheduler.settings import SchedulerSettings
from tests.unit.test_scheduling_state import T0


class Sent:
    """The session service, as the scheduler's commands reach it: each is noted."""

    def __init__(self) -> None:
        self.commands: list[Command] = []

    async def send(self, command: Command, *, actor: str, **_: object) -> None:
        self.commands.append(command)

    def of(self, kind: type[Command]) -> list[Command]:
        return [c for c in self.commands if isinstance(c, kind)]


def hook(name: str, *actions: HookAction) -> NamedHook:
    async def call(state: AgentSchedulingState) -> Sequence[HookAction]:
        return actions

    return NamedHook(name, call)


async def review(*hooks: NamedHook, useful: bool = True, sent: Sent | None = None) -> Sent:
    """An activation of session s ended; the scheduler reviews it with `hooks`."""
    sent = sent or Sent()
    scheduler = Scheduler(
        cast("NATS", object()),
        DEFAULT_TOPOLOGY,
        cast("EventStore", object()),
        cast("CommandClient", sent),
        "postgresql://unused/db",
        SchedulerSettings(),
        Hooks(hooks),
        clock=lambda: T0,
    )
    s = SessionSchedule("s", project_id="p", agent_id="a", opened=True)
    ended = Ended("x1", "completed", useful, ("m1",), frozenset({SignalKind.USER_MESSAGE}), T0)
    s.last_ended = ended
    await scheduler._review(s, ended)
    assert s.reviewed == "x1"
    return sent


async def test_a_naive_not_before_is_read_as_utc_and_the_other_actions_are_sent() -> None:
    later = HookSignal(key="later", not_before=datetime(2030, 1, 2))  # noqa: DTZ001 - the point
    sent = await review(
        hook("a", later, HookMessage(key="hi", text="follow up")),
        hook("b", HookMessage(key="other", text="from another hook")),
    )
    [signal] = sent.of(RecordSignal)
    assert isinstance(signal, RecordSignal)
    assert signal.not_before == datetime(2030, 1, 2, tzinfo=UTC)
    messages = sent.of(PostMessage)
    assert sorted(m.text for m in messages if isinstance(m, PostMessage)) == [
        "follow up",
        "from another hook",
    ]


async def test_an_action_the_commands_refuse_is_skipped_alone() -> None:
    too_big = HookSignal(key="big", payload={"blob": "x" * MAX_PAYLOAD_BYTES})
    too_early = HookSignal(key="early", not_before=datetime(1999, 12, 31, tzinfo=UTC))
    sent = await review(
        hook("a", too_big, HookMessage(key="hi", text="follow up"), too_early),
        hook("b", HookSignal(key="fine")),
    )
    assert [type(c) for c in sent.commands] == [PostMessage, RecordSignal]
    [signal] = sent.of(RecordSignal)
    assert isinstance(signal, RecordSignal)
    assert signal.payload == {"hook": "b"}


async def test_when_every_action_was_refused_the_nudge_rule_still_applies() -> None:
    """No hook acted: an activation that did nothing useful gets its one nudge."""
    too_early = HookSignal(key="early", not_before=datetime(1999, 12, 31, tzinfo=UTC))
    sent = await review(hook("a", too_early), useful=False)
    [nudge] = sent.of(RecordSignal)
    assert isinstance(nudge, RecordSignal)
    assert nudge.kind is SignalKind.NUDGE


@pytest.mark.parametrize("plain", [False, True], ids=["async", "plain"])
async def test_a_hook_that_calls_sys_exit_fails_alone(plain: bool) -> None:
    """A hook's `sys.exit()` is its own failure: the review goes on with the other hooks'
    actions — the scheduler is not stopped (asyncio lets `SystemExit` out of the loop)."""

    def leaving(state: AgentSchedulingState) -> Sequence[HookAction]:
        sys.exit("a click-style helper gave up")

    async def leaving_async(state: AgentSchedulingState) -> Sequence[HookAction]:
        sys.exit("a click-style helper gave up")

    call = cast("SchedulerHook", leaving if plain else leaving_async)
    sent = await review(NamedHook("exits", call), hook("b", HookSignal(key="fine")))
    [signal] = sent.of(RecordSignal)
    assert isinstance(signal, RecordSignal)
    assert signal.payload == {"hook": "b"}


class Refusing(Sent):
    """The session service refusing every message a hook asks for (as it would one too long
    once the text is its own, or an internal error)."""

    async def send(self, command: Command, *, actor: str, **_: object) -> None:
        if isinstance(command, PostMessage):
            raise InvalidError("refused by the session service")
        await super().send(command, actor=actor)


async def test_a_hook_action_the_session_service_refuses_is_not_counted_as_done() -> None:
    """No hook's action was done — the session service refused it, not the validation here:
    an activation that did nothing useful still gets its one nudge."""
    sent = await review(hook("a", HookMessage(key="hi", text="follow up")), useful=False,
                        sent=Refusing())  # fmt: skip
    assert sent.of(PostMessage) == []
    [nudge] = sent.of(RecordSignal)
    assert isinstance(nudge, RecordSignal)
    assert nudge.kind is SignalKind.NUDGE
