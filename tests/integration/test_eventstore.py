"""The event store against a real NATS server: conditional appends, atomic batches, lost acks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import nats.errors
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.errors import CommandTimeoutError, InvalidError
from suzumio.contracts.events import (
    ProjectCreated,
    ProjectRenamed,
    SessionMessageAppended,
    SessionOpened,
)
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.contracts.values import Author
from suzumio.platform.bus.eventstore import (
    HDR_MSG_ID,
    ConcurrencyConflictError,
    EventStore,
)
from suzumio.platform.bus.jsapi import stream_last_seq
from suzumio.platform.bus.replies import Replies
from tests.support import eventually


def created(name: str = "p") -> ProjectCreated:
    return ProjectCreated(name=name, owner_id="user-1")


async def test_append_and_load_round_trip(store: EventStore) -> None:
    pid = new_id()
    meta = EventMeta(actor="user:u1", correlation_id="corr-1")
    first = await store.append(pid, [created()], 0, meta)
    second = await store.append(pid, [ProjectRenamed(name="q"), ProjectRenamed(name="r")], 1)

    assert [r.version for r in first.events + second.events] == [1, 2, 3]
    seqs = [r.seq for r in first.events + second.events]
    assert seqs[0] < seqs[1] == seqs[2]  # one append, one commit message
    stream = await store.load("project", pid)
    assert [e.version for e in stream.events] == [1, 2, 3]
    assert [type(e.data) for e in stream.events] == [ProjectCreated, ProjectRenamed, ProjectRenamed]
    assert stream.events[2].data == ProjectRenamed(name="r")
    assert stream.events[0].envelope.actor == "user:u1"
    assert stream.events[0].envelope.correlation_id == "corr-1"
    assert stream.version == 3
    assert stream.seq == seqs[-1]


async def test_load_of_unknown_aggregate_is_empty(store: EventStore) -> None:
    stream = await store.load("project", new_id())
    assert stream.events == ()
    assert stream.version == 0


async def test_stale_expected_version_is_a_conflict(store: EventStore) -> None:
    pid = new_id()
    await store.append(pid, [created()], 0)
    await store.append(pid, [ProjectRenamed(name="b")], 1)

    with pytest.raises(ConcurrencyConflictError) as info:
        await store.append(pid, [ProjectRenamed(name="c")], 1)
    assert (info.value.expected_version, info.value.actual_version) == (1, 2)
    with pytest.raises(ConcurrencyConflictError):
        await store.append(pid, [created()], 0)  # the aggregate exists already


async def test_conflict_detected_by_the_server_between_two_stores(
    nc: NATS, topology: Topology
) -> None:
    # Two processes' worth of stores: each has only its own cache, so the server must refuse.
    a, b = EventStore(nc, topology), EventStore(nc, topology)
    pid = new_id()
    await a.append(pid, [created()], 0)
    await b.append(pid, [ProjectRenamed(name="from b")], 1)

    with pytest.raises(ConcurrencyConflictError) as info:
        await a.append(pid, [ProjectRenamed(name="from a")], 1)
    assert info.value.actual_version == 2
    versions = [e.version for e in (await a.load("project", pid)).events]
    assert versions == [1, 2]


async def test_append_next_tries_the_likely_version_without_a_lookup(
    nc: NATS, topology: Topology
) -> None:
    a, b = EventStore(nc, topology), EventStore(nc, topology)
    pid = new_id()
    lookups: list[str] = []

    async def on_get(msg: Msg) -> None:
        lookups.append(msg.subject)

    spy = await nc.subscribe("$JS.API.DIRECT.GET.>", cb=on_get)
    try:
        assert (await a.append_next(pid, [created()], likely_version=0)).version == 1
        await nc.flush()
        assert lookups == []  # a right guess: the append alone
        await b.append(pid, [ProjectRenamed(name="from b")], 1)
        # A wrong guess: refused, and the refusal's reading of the head is where it goes.
        result = await a.append_next(pid, [ProjectRenamed(name="from a")], likely_version=0)
        assert result.version == 3
    finally:
        await spy.unsubscribe()
    versions = [(e.version, e.data) for e in (await a.load("project", pid)).events]
    assert [v for v, _ in versions] == [1, 2, 3]
    assert versions[2][1] == ProjectRenamed(name="from a")


async def test_an_append_of_several_events_is_all_or_nothing(nc: NATS, topology: Topology) -> None:
    a, b = EventStore(nc, topology), EventStore(nc, topology)
    pid = new_id()
    await a.append(pid, [created()], 0)
    await b.append(pid, [ProjectRenamed(name="b")], 1)

    with pytest.raises(ConcurrencyConflictError):
        await a.append(pid, [ProjectRenamed(name=f"a{i}") for i in range(5)], 1)
    stream = await a.load("project", pid)
    assert [e.version for e in stream.events] == [1, 2]


async def test_events_of_two_aggregates_cannot_share_an_append(store: EventStore) -> None:
    with pytest.raises(InvalidError):
        await store.append(new_id(), [created(), SessionOpened(project_id="p", agent_id="a")], 0)
    with pytest.raises(InvalidError):
        await store.append("not a valid.id", [created()], 0)
    with pytest.raises(InvalidError):
        await store.append(new_id(), [], 0)


async def test_an_append_larger_than_the_bus_carries_is_refused_as_input(
    nc: NATS, store: EventStore
) -> None:
    session_id = new_id()
    text = "x" * 1_000_000  # each event within its own bound; together more than a message
    events = [
        SessionMessageAppended(
            message_id=new_id(), author=Author(kind="user", id="u"), role="user", text=text
        )
        for _ in range(nc.max_payload // len(text) + 1)
    ]
    with pytest.raises(InvalidError, match="this append carries at most"):
        await store.append(session_id, events, 0)
    assert not (await store.load("session", session_id)).events


def message(text: str) -> SessionMessageAppended:
    return SessionMessageAppended(
        message_id=new_id(), author=Author(kind="user", id="u"), role="user", text=text
    )


async def test_an_append_fitting_the_bus_only_without_its_headers_is_refused_as_input(
    nc: NATS, store: EventStore
) -> None:
    """The server counts a message's headers (each event's type, its version, the expected
    sequence) against max_payload with its payload, and answers one over it by closing the
    connection — every append and command in flight on it lost, and a retry closing it again.
    nats-py checks the payload alone."""
    session_id = new_id()
    full = ["x" * 1_000_000] * (nc.max_payload // 1_000_000)
    base = len((await store.prepare(session_id, [message(t) for t in [*full, ""]], 0)).payload)
    # A payload just within max_payload: its headers (a few hundred bytes) take it past.
    last = "x" * (nc.max_payload - base - 40)
    reconnects = nc.stats["reconnects"]
    with pytest.raises(InvalidError, match="this append carries at most"):
        await store.append(session_id, [message(t) for t in [*full, last]], 0)
    await nc.flush()
    assert nc.is_connected
    assert nc.stats["reconnects"] == reconnects
    assert not (await store.load("session", session_id)).events


async def test_a_request_fitting_the_bus_only_without_its_headers_is_never_sent(
    nc: NATS,
) -> None:
    replies = Replies.of(nc)
    subject = f"test.{new_id()}"
    sub = await nc.subscribe(subject)
    reconnects = nc.stats["reconnects"]
    with pytest.raises(nats.errors.MaxPayloadError):
        await replies.request(subject, b"x" * (nc.max_payload - 10), {"Suzumio-Type": "a"}, 5)
    await nc.flush()
    assert nc.is_connected
    assert nc.stats["reconnects"] == reconnects
    assert sub.pending_msgs == 0
    await sub.unsubscribe()


async def test_an_earlier_attempt_still_in_process_is_waited_for_not_failed(
    nc: NATS, store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a cluster, an append retried while its first attempt is still being agreed on gets
    "duplicate message id is in process" (10158). That is no failure: asked again, the server
    answers for the first attempt (stored: a duplicate, or a refusal the store reads its way
    past). (The answer is made here: one server alone never gives it.)"""
    send = store._send
    answers: list[dict[str, Any]] = []

    async def in_process_once(p: Any) -> dict[str, Any]:
        answer = await send(p)  # the first attempt lands, but its answer says "in process"
        if not answers:
            answer = {"error": {"code": 409, "err_code": 10158, "description": "in process"}}
        answers.append(answer)
        return answer

    monkeypatch.setattr(store, "_send", in_process_once)
    pid = new_id()
    result = await store.append(pid, [created()], 0)
    assert len(answers) == 2  # asked again, the server answered for the first attempt
    stream = await store.load("project", pid)
    assert [(e.version, e.seq) for e in stream.events] == [(1, result.events[0].seq)]


def _electing() -> dict[str, Any]:
    return {"error": {"code": 503, "err_code": 10008, "description": "no leader"}}


def _connection_gone() -> dict[str, Any]:
    raise nats.errors.OutboundBufferLimitError


@pytest.mark.parametrize("retried", [_electing, _connection_gone], ids=["electing", "gone"])
@pytest.mark.parametrize("stored_first", [True, False], ids=["stored", "not_stored"])
async def test_trouble_after_a_lost_answer_leaves_the_appends_fate_unknown(
    nc: NATS,
    store: EventStore,
    monkeypatch: pytest.MonkeyPatch,
    stored_first: bool,
    retried: Callable[[], dict[str, Any]],
) -> None:
    """The first attempt's answer never comes (stored or not, the writer cannot tell) and
    its log cannot be read then; the retry meets a stream electing its leader (503), or
    fails on the client's side (the connection closed, its buffer full while it
    reconnects). That says nothing of the first attempt: the append's fate is unknown — a
    typed `CommandTimeoutError` — unless the log then shows it stored. Raised as the 503 or
    the client's error itself, it read as "nothing stored" (a 503 the API's clients retry
    under new ids: twice posted). (The answers are made here: one server alone never elects
    a leader.)"""
    send, find_own = store._send, store._find_own
    sends: list[int] = []
    readable = asyncio.Event()

    async def lost_then_trouble(p: Any) -> dict[str, Any]:
        sends.append(1)
        if len(sends) == 1:
            if stored_first:
                await send(p)  # stored, its answer lost
            raise nats.errors.TimeoutError
        readable.set()
        return retried()

    async def unreadable_at_first(p: Any, *, tolerate_errors: bool = False) -> int | None:
        if not readable.is_set():
            return None  # as after a read that failed, tolerated
        return await find_own(p, tolerate_errors=tolerate_errors)

    monkeypatch.setattr(store, "_send", lost_then_trouble)
    monkeypatch.setattr(store, "_find_own", unreadable_at_first)
    pid = new_id()
    if stored_first:
        result = await store.append(pid, [created()], 0)
        assert [e.version for e in result.events] == [1]
    else:
        with pytest.raises(CommandTimeoutError):
            await store.append(pid, [created()], 0)
    assert len(sends) == 2


async def test_publish_retried_after_a_lost_ack_stores_one_event(
    nc: NATS, store: EventStore, topology: Topology
) -> None:
    pid = new_id()
    prepared = await store.prepare(pid, [created()], 0)
    # The first attempt reaches the server, but its ack goes nowhere: published without a
    # reply subject, exactly what the writer sees when the ack is lost on the way back.
    await nc.publish(prepared.subject, prepared.payload, headers=store._headers(prepared))
    await nc.flush()
    stored = await eventually(
        lambda: store.load("project", pid), lambda s: s.version == 1, what="the lost append"
    )
    last_before = stored.seq

    result = await store.commit(prepared)  # the writer retries the same append

    assert result.seq == last_before
    assert await stream_last_seq(nc, topology.events_stream) == last_before
    assert [e.id for e in (await store.load("project", pid)).events] == [result.events[0].id]


async def test_retry_after_lost_ack_succeeds_even_if_others_wrote_since(
    nc: NATS, store: EventStore, topology: Topology
) -> None:
    pid = new_id()
    prepared = await store.prepare(pid, [created(), ProjectRenamed(name="x")], 0)
    await nc.publish(prepared.subject, prepared.payload, headers=store._headers(prepared))
    await nc.flush()
    other = EventStore(nc, topology)
    await eventually(  # the lost batch was stored...
        lambda: other.load("project", pid), lambda s: s.version == 2, what="the lost batch"
    )
    await other.append(pid, [ProjectRenamed(name="later")], 2)  # ...and someone built on it

    result = await store.commit(prepared)

    assert [r.version for r in result.events] == [1, 2]
    loaded = await store.load("project", pid)
    assert [e.id for e in loaded.events[:2]] == [r.id for r in result.events]
    assert loaded.version == 3


async def test_message_ids_are_event_ids(nc: NATS, store: EventStore, topology: Topology) -> None:
    pid = new_id()
    result = await store.append(pid, [created()], 0)
    msg = await nc.jetstream().get_last_msg(
        topology.events_stream, topology.event_subject("project", pid)
    )
    assert msg.headers is not None
    assert msg.headers[HDR_MSG_ID] == result.events[0].id


async def test_appends_to_many_aggregates_pipeline_concurrently(store: EventStore) -> None:
    ids = [new_id() for _ in range(300)]
    results = await asyncio.gather(*(store.append(i, [created()], 0) for i in ids))
    assert len({r.seq for r in results}) == 300
    await asyncio.gather(*(store.append(i, [ProjectRenamed(name="n")], 1) for i in ids))
    heads = await asyncio.gather(*(store.head("project", i) for i in ids))
    assert {h.version for h in heads} == {2}


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    writers=st.integers(min_value=2, max_value=6),
    rounds=st.integers(min_value=1, max_value=6),
    batch=st.integers(min_value=1, max_value=3),
)
async def test_concurrent_writers_one_winner_per_version(
    nc: NATS, topology: Topology, writers: int, rounds: int, batch: int
) -> None:
    """Writers that all read version v and append race: exactly one wins each round, the
    others get a conflict, and the aggregate's versions have no gaps and no forks."""
    stores = [EventStore(nc, topology) for _ in range(writers)]
    pid = new_id()
    await stores[0].append(pid, [created()], 0)
    version = 1
    winners: list[int] = []
    for _ in range(rounds):
        outcomes = await asyncio.gather(
            *(
                s.append(pid, [ProjectRenamed(name=f"w{i}") for _ in range(batch)], version)
                for i, s in enumerate(stores)
            ),
            return_exceptions=True,
        )
        won = [i for i, o in enumerate(outcomes) if not isinstance(o, BaseException)]
        lost = [o for o in outcomes if isinstance(o, BaseException)]
        assert len(won) == 1
        assert all(isinstance(o, ConcurrencyConflictError) for o in lost)
        winners.append(won[0])
        version += batch

    stream = await stores[0].load("project", pid)
    assert [e.version for e in stream.events] == list(range(1, version + 1))
    names = [e.data.name for e in stream.events[1:] if isinstance(e.data, ProjectRenamed)]
    assert names == [f"w{w}" for w in winners for _ in range(batch)]
