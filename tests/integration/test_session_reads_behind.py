"""The session service's own checks (the actor's role, the session there at all, closed) on
a replicated log: a Direct Get may be answered by a follower that has not applied a write
acknowledged a moment ago, and a refusal decided on it (a member just added refused, a
session just opened not found) is read again from a replica holding every acknowledged write
before it is answered. Real NATS; the follower behind is `ReadsBehind`."""

from __future__ import annotations

from nats.aio.client import Client as NATS

from suzumio.contracts.commands import CloseSession
from suzumio.contracts.events import MemberAdded, UserCreated
from suzumio.contracts.subjects import Topology
from suzumio.contracts.values import Role
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.eventstore import EventStore
from tests.integration.test_pending_answer_signal_failure import session_service
from tests.scheduling import Sessions
from tests.support import ReadsBehind


async def test_a_member_added_a_moment_ago_is_not_refused_by_a_replica_behind(
    nc: NATS, topology: Topology, store: EventStore
) -> None:
    sessions = Sessions(store)
    await store.append("bob", [UserCreated(name="bob")], 0)
    project = await sessions.project()
    session_id = await sessions.session(project)
    await store.append_next(project, [MemberAdded(user_id="bob", role=Role.MEMBER)])
    behind = ReadsBehind(nc, topology, aggregates={"project"})
    async with session_service(nc, topology, behind):
        reply = await CommandClient(nc, topology).send(
            CloseSession(session_id=session_id), actor="user:bob"
        )
    assert reply.events
    assert behind.behind_reads >= 1  # it was read behind first


async def test_a_session_opened_a_moment_ago_is_found_by_a_replica_behind(
    nc: NATS, topology: Topology, store: EventStore
) -> None:
    sessions = Sessions(store)
    await store.append("u", [UserCreated(name="u")], 0)
    session_id = await sessions.session(await sessions.project())
    behind = ReadsBehind(nc, topology, aggregates={"session"})
    async with session_service(nc, topology, behind):
        reply = await CommandClient(nc, topology).send(
            CloseSession(session_id=session_id), actor="user:u"
        )
    assert reply.events
    assert behind.behind_reads >= 1
