"""An activation's history, appended by the session service on the session it holds: no read
of the log before the append, which is conditional on the held state's version — a session
another writer moved meanwhile (a cancel) is read again then, and the append decided on the
latest. Real NATS."""

from __future__ import annotations

from typing import Any

import pytest
from nats.aio.client import Client as NATS

from suzumio.contracts.commands import AppendHistory, CommandRequest
from suzumio.contracts.commands.sessions import HistoryEntry
from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.errors import ForbiddenError, NotFoundError
from suzumio.contracts.events import (
    ActivationCancelRequested,
    ActivationRequested,
    SessionMessageAppended,
    SessionOpened,
)
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.commands import CommandContext
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.bus.jsapi import ensure_streams
from suzumio.session.domain.session import SessionState
from suzumio.session.handlers.base import Context
from suzumio.session.handlers.sessions import SessionHandlers
from suzumio.session.repository import Repository

AGENT = new_id()


def _append(session_id: str, activation_id: str) -> CommandContext[AppendHistory]:
    cmd = AppendHistory(
        session_id=session_id,
        activation_id=activation_id,
        agent_id=AGENT,
        entries=(HistoryEntry(message_id=new_id(), role="assistant", text="hi"),),
    )
    request = CommandRequest(
        service="session", verb="append_history", actor="system:toolbroker", data={}
    )
    return CommandContext(cmd, request)


async def _counted_reads(store: EventStore) -> list[str]:
    """Every read of an aggregate's events or head the store makes from here on."""
    reads: list[str] = []
    events, head_of = store.events, store._head_of

    def counted_events(*args: Any, **kwargs: Any) -> Any:
        reads.append("events")
        return events(*args, **kwargs)

    async def counted_head(subject: str, floor: int = 0) -> Any:
        reads.append("head")
        return await head_of(subject, floor)

    store.events = counted_events  # type: ignore[method-assign]
    store._head_of = counted_head  # type: ignore[method-assign]
    return reads


async def test_history_on_a_held_session_is_appended_without_reading_the_log(
    nc: NATS, topology: Topology
) -> None:
    await ensure_streams(nc, topology.streams())
    store = EventStore(nc, topology)
    session_id, activation_id = new_id(), new_id()
    await store.append(
        session_id,
        [
            SessionOpened(project_id=new_id(), agent_id=AGENT),
            ActivationRequested(activation_id=activation_id, agent_id=AGENT, signal_ids=()),
        ],
        0,
        EventMeta(),
    )
    repo = Repository(store)
    handlers = SessionHandlers(Context(repo))
    await repo.get(SessionState, session_id)  # held from here on
    reads = await _counted_reads(store)

    first = _append(session_id, activation_id)
    await handlers.append_history(first)
    assert reads == []
    await handlers.append_history(_append(session_id, activation_id))
    assert reads == []

    # Another writer cancels the activation: the held state is behind, the append conditional
    # on it is refused, and the command is decided again on the log's state.
    head = (await store.load("session", session_id)).version
    await EventStore(nc, topology).append(
        session_id,
        [ActivationCancelRequested(activation_id=activation_id, reason="P0")],
        head,
        EventMeta(),
    )
    with pytest.raises(ForbiddenError, match="cancelled"):
        await handlers.append_history(_append(session_id, activation_id))
    assert reads  # the latest was read
    stream = await store.load("session", session_id)
    written = [e.data for e in stream.events if isinstance(e.data, SessionMessageAppended)]
    assert len(written) == 2
    assert written[0].message_id == first.command.entries[0].message_id


async def test_history_for_a_session_that_does_not_exist_is_not_found(
    nc: NATS, topology: Topology
) -> None:
    await ensure_streams(nc, topology.streams())
    handlers = SessionHandlers(Context(Repository(EventStore(nc, topology))))
    with pytest.raises(NotFoundError, match="session not found"):
        await handlers.append_history(_append(new_id(), new_id()))
