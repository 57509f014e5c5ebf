"""`message.send` names a session by id, and the broker sends only to one of the caller's
project: which project a session is of is in its first commit. The broker reads that one
message, never the session's whole history (entries of up to 1 MB each, which an agent could
otherwise have it read again and again, one message at a time)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

from suzumio.contracts.commands import CommandAccepted, PostMessage, RecordSignal
from suzumio.contracts.envelope import EventEnvelope, EventMeta, envelope_for
from suzumio.contracts.events import SessionOpened
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.tokens import ActivationClaims
from suzumio.toolbroker.support import SupportContext


class FirstOnly:
    """A store that can tell a session's first commit, and fails a test that loads more."""

    def __init__(self, first: dict[str, list[EventEnvelope]]) -> None:
        self._first = first
        self.loads: list[str] = []

    async def first(self, aggregate: str, aggregate_id: str) -> list[EventEnvelope]:
        assert aggregate == "session"
        return self._first.get(aggregate_id, [])

    async def load(self, aggregate: str, aggregate_id: str, **_: Any) -> Any:
        self.loads.append(aggregate_id)
        raise AssertionError("the whole session was read")


def context(store: FirstOnly, commands: object = None) -> SupportContext:
    claims = ActivationClaims(
        activation_id="a1",
        session_id="s1",
        project_id="p1",
        agent_id="g1",
        expires_at=datetime.now(UTC) + timedelta(minutes=5),
    )
    return SupportContext(
        claims, "core", "message.send", "call_1", cast("CommandClient", commands),
        cast("EventStore", store),
    )  # fmt: skip


async def test_a_sessions_project_is_read_from_its_opening_alone() -> None:
    opening = envelope_for(
        SessionOpened(project_id="p2", agent_id="g2"), aggregate_id="s2", version=1,
        meta=EventMeta(),
    )  # fmt: skip
    store = FirstOnly({"s2": [opening]})
    ctx = context(store)
    assert await ctx.session_project("s2") == "p2"
    assert await ctx.session_project("nowhere") is None
    assert store.loads == []


class Sent:
    """Records the commands a support call sends (the session service's part is tested with
    it in `tests/e2e/test_broker_access.py`)."""

    def __init__(self) -> None:
        self.commands: list[Any] = []

    async def send(self, command: Any, *, actor: str) -> CommandAccepted:
        self.commands.append(command)
        return CommandAccepted()


async def test_work_an_agent_queues_for_its_own_session_names_its_activation() -> None:
    """So that the session refuses it once the activation is fenced (a cancel stored while the
    call was on its way); a message to another session names none — that session's state
    says nothing of this activation."""
    opening = envelope_for(
        SessionOpened(project_id="p1", agent_id="g2"), aggregate_id="s2", version=1,
        meta=EventMeta(),
    )  # fmt: skip
    own = envelope_for(
        SessionOpened(project_id="p1", agent_id="g1"), aggregate_id="s1", version=1,
        meta=EventMeta(),
    )  # fmt: skip
    sent = Sent()
    ctx = context(FirstOnly({"s1": [own], "s2": [opening]}), sent)
    await ctx.record_signal("reminder", {}, "P3", None)
    await ctx.post_message("s1", "note to self", None)
    await ctx.post_message("s2", "to a peer", None)
    signal, to_self, to_peer = sent.commands
    assert isinstance(signal, RecordSignal)
    assert signal.activation_id == "a1"
    assert isinstance(to_self, PostMessage)
    assert to_self.activation_id == "a1"
    assert isinstance(to_peer, PostMessage)
    assert to_peer.activation_id is None
