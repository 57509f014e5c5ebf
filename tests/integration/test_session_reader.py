"""The orchestrator's session reader (real NATS): a snapshot is the session exactly as it was
when its request was stored — the same as reading the whole session — whether the reader
folds on from a kept fold, falls back for an older request, or starts afresh."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from suzumio.contracts.envelope import DomainEvent, EventEnvelope, EventMeta
from suzumio.contracts.events import (
    ActivationCancelRequested,
    ActivationRequested,
    HistoryCompacted,
    SessionMessageAppended,
    SessionOpened,
    SignalClosed,
    SignalRecorded,
    SignalsDelivered,
)
from suzumio.contracts.ids import new_id
from suzumio.contracts.values import Author, Priority, SignalKind, SignalOutcome
from suzumio.orchestrator.sessions import (
    REQUESTS_KEPT,
    SessionReader,
    SessionReadError,
    SessionSnapshot,
    load_session,
)
from suzumio.platform.bus.eventstore import AggregateStream, EventStore

META = EventMeta(actor="system:test")


def message(text: str, role: str = "user") -> SessionMessageAppended:
    return SessionMessageAppended(
        message_id=new_id(), author=Author(kind="user", id="u"), role=role, text=text
    )


def answer(text: str, activation_id: str) -> SessionMessageAppended:
    """An agent's entry, written by `activation_id`."""
    return SessionMessageAppended(
        message_id=new_id(),
        author=Author(kind="agent", id="a" * 26),
        role="assistant",
        text=text,
        activation_id=activation_id,
    )


def request(*signal_ids: str) -> ActivationRequested:
    return ActivationRequested(activation_id=new_id(), agent_id="a" * 26, signal_ids=signal_ids)


def signal_for(msg: SessionMessageAppended) -> SignalRecorded:
    return SignalRecorded(
        signal_id=new_id(),
        agent_id="a" * 26,
        kind=SignalKind.USER_MESSAGE,
        priority=Priority.P1,
        message_id=msg.message_id,
    )


async def opened(store: EventStore) -> tuple[str, Callable[..., Awaitable[None]]]:
    """A new session, and how to store the session's next message (its events as one)."""
    session = new_id()

    async def add(*events: DomainEvent) -> None:
        await store.append_next(session, list(events), META)

    await add(SessionOpened(project_id="p" * 26, agent_id="a" * 26))
    return session, add


async def stored(
    add: Callable[..., Awaitable[None]], text: str
) -> tuple[SessionMessageAppended, SignalRecorded]:
    """A user's message stored with its signal."""
    msg = message(text)
    signal = signal_for(msg)
    await add(msg, signal)
    return msg, signal


async def posted(add: Callable[..., Awaitable[None]], text: str) -> ActivationRequested:
    """A user's message stored with its signal; the request for that signal (not stored)."""
    _, signal = await stored(add, text)
    return request(signal.signal_id)


def texts(snapshot: SessionSnapshot) -> list[str]:
    return [m.content or "" for m in snapshot.history]


async def test_snapshots_match_a_full_read_however_they_are_folded(store: EventStore) -> None:
    session, add = await opened(store)
    r1 = await posted(add, "one")
    await add(r1)
    await add(message("answer one", "assistant"))
    r2 = await posted(add, "two")
    await add(r2)

    reader = SessionReader(store)
    snap2 = await reader.snapshot(session, r2)  # afresh, kept
    assert texts(snap2) == ["one", "answer one", "two"]
    assert [s.text for s in snap2.signals] == ["two"]
    assert snap2 == await load_session(store, session, r2)

    snap1 = await reader.snapshot(session, r1)  # older than the kept fold: read afresh
    assert texts(snap1) == ["one"]
    assert [s.text for s in snap1.signals] == ["one"]
    assert snap1 == await load_session(store, session, r1)

    # Later turns, with a compaction: folded on from the kept fold (r2's), not from r1's.
    await add(message("answer two", "assistant"))
    archived = [m.id for m in snap2.history if m.id]
    await add(
        HistoryCompacted(
            activation_id=new_id(),
            marker_id=new_id(),
            summary="they said one and two",
            archived_from=archived[0],
            archived_through=archived[-1],
            archived_count=len(archived),
            archived_ids=tuple(archived),
        )
    )
    r3 = await posted(add, "three")
    await add(r3, message("after the request"))
    snap3 = await reader.snapshot(session, r3)
    assert snap3 == await load_session(store, session, r3)
    assert "after the request" not in texts(snap3)
    assert "one" not in texts(snap3)  # compacted away
    assert any("they said one and two" in t for t in texts(snap3))
    assert [s.text for s in snap3.signals] == ["three"]
    # And an older request still reads as it was.
    assert await reader.snapshot(session, r2) == snap2


async def test_a_request_amid_its_message_leaves_the_next_snapshot_whole(
    store: EventStore,
) -> None:
    """The scheduler stores a preempt as one message — the cancel, the request, its signals'
    delivery — so a fold stops amid it; the session's next request folds on from there without
    skipping the rest of that message or folding its first part twice."""
    session, add = await opened(store)
    r1 = await posted(add, "one")
    r2 = await posted(add, "stop that")
    await add(
        ActivationCancelRequested(activation_id=r1.activation_id, reason="replaced"),
        r2,
        SignalsDelivered(activation_id=r2.activation_id, signal_ids=r2.signal_ids),
    )
    reader = SessionReader(store)
    assert texts(await reader.snapshot(session, r2)) == ["one", "stop that"]
    await add(message("stopped", "assistant"))
    r3 = await posted(add, "go on")
    await add(r3)

    snap3 = await reader.snapshot(session, r3)  # folded on from amid the preempt's message

    assert snap3 == await load_session(store, session, r3)
    assert texts(snap3) == ["one", "stop that", "stopped", "go on"]
    assert [s.text for s in snap3.signals] == ["go on"]


class CountingStore:
    """The store, counting the session reads the reader makes."""

    def __init__(self, store: EventStore) -> None:
        self._store = store
        self.reads = 0

    async def load(self, aggregate: str, aggregate_id: str, **kwargs: Any) -> AggregateStream:
        self.reads += 1
        return await self._store.load(aggregate, aggregate_id, **kwargs)


async def messages_after(
    store: EventStore, session: str, seq: int
) -> list[tuple[int, list[EventEnvelope]]]:
    """The session's messages stored after `seq`, as the followed log delivers them."""
    by_seq: dict[int, list[EventEnvelope]] = {}
    for event in (await store.load("session", session)).events:
        if event.seq > seq:
            by_seq.setdefault(event.seq, []).append(event.envelope)
    return sorted(by_seq.items())


@dataclass
class Kept:
    """A session whose first request was planned: its fold kept by `reader`, up to
    `position`; `reads` counts the reader's reads."""

    session: str
    add: Callable[..., Awaitable[None]]
    reader: SessionReader
    reads: CountingStore
    position: int


async def kept(store: EventStore) -> Kept:
    session, add = await opened(store)
    r1 = await posted(add, "one")
    await add(r1)
    counting = CountingStore(store)
    reader = SessionReader(counting)  # type: ignore[arg-type]
    await reader.snapshot(session, r1)  # read, and kept
    position = (await store.head("session", session)).seq
    return Kept(session, add, reader, counting, position)


async def test_a_kept_fold_follows_the_log_and_its_requests_read_nothing(
    store: EventStore,
) -> None:
    """The orchestrator's follower hands the reader each of the session's messages: the kept
    fold goes on with them, and a request's snapshot, taken as it went by, is the full read's
    — a request amid its message included — without a read."""
    k = await kept(store)
    assert k.reads.reads == 1
    await k.add(message("answer one", "assistant"))
    r2 = await posted(k.add, "two")
    await k.add(r2, message("after the request"))
    for seq, envelopes in await messages_after(store, k.session, k.position):
        assert k.reader.keeps(k.session)
        k.reader.observe(k.session, seq, envelopes)

    snap2 = await k.reader.snapshot(k.session, r2)
    assert k.reads.reads == 1  # nothing read
    assert snap2 == await load_session(store, k.session, r2)
    assert texts(snap2) == ["one", "answer one", "two"]


async def test_a_kept_fold_that_missed_a_message_reads_on_instead(store: EventStore) -> None:
    """A message the follower delivered before the fold was kept is not there: the next one
    does not continue it, and the plan reads what it lacks (the same snapshot)."""
    k = await kept(store)
    await k.add(message("missed", "assistant"))
    r2 = await posted(k.add, "two")
    await k.add(r2)
    missed, *rest = await messages_after(store, k.session, k.position)
    for seq, envelopes in rest:
        k.reader.observe(k.session, seq, envelopes)

    snap2 = await k.reader.snapshot(k.session, r2)
    assert k.reads.reads == 2  # read on from the kept fold
    assert snap2 == await load_session(store, k.session, r2)
    assert texts(snap2) == ["one", "missed", "two"]
    assert missed[0] < rest[0][0]


async def test_a_message_the_fold_cannot_take_drops_it(store: EventStore) -> None:
    """An event the reader cannot decode (a newer release's) drops the kept fold rather than
    leave it half folded: the plan reads, and meets the same event there."""
    k = await kept(store)
    session, reader = k.session, k.reader
    head = await store.head("session", session)
    strange = EventEnvelope.model_validate(
        {
            "id": new_id(),
            "type": "session.from_the_future",
            "aggregate": "session",
            "aggregate_id": session,
            "version": head.version + 1,
            "occurred_at": "2030-01-01T00:00:00Z",
            "actor": "system:future",
            "correlation_id": "c",
            "schema": 1,
            "data": {},
        }  # fmt: skip
    )
    reader.observe(session, head.seq + 1, [strange])
    assert not reader.keeps(session)


async def test_a_snapshot_no_plan_took_is_forgotten_when_its_activation_ends(
    store: EventStore,
) -> None:
    """A request cancelled before it was planned never asks for its snapshot: its end lets
    it go (each holds a session's history), and a later ask reads."""
    k = await kept(store)
    r2 = await posted(k.add, "two")
    await k.add(r2)
    for seq, envelopes in await messages_after(store, k.session, k.position):
        k.reader.observe(k.session, seq, envelopes)

    k.reader.forget(r2.activation_id)

    assert await k.reader.snapshot(k.session, r2) == await load_session(store, k.session, r2)
    assert k.reads.reads == 3  # not taken: read (afresh, as the kept fold is past it)


async def test_a_kept_fold_holds_no_text_of_the_runners_own_entries(store: EventStore) -> None:
    """A posted message's text goes to its signal (in the snapshot); the runner's own entries
    (tool outputs of up to 1 MB among them) are in the history only — kept besides for a
    lookup no signal makes, they outlived their compaction in every kept fold."""
    session, add = await opened(store)
    r1 = await posted(add, "look into it")
    await add(r1)
    outputs = []
    for n in range(5):
        entry = SessionMessageAppended(
            message_id=new_id(),
            author=Author(kind="agent", id="a" * 26),
            role="tool",
            text=f"output {n}: " + "x" * 100_000,
            activation_id=r1.activation_id,
        )
        outputs.append(entry)
        await add(entry)
    await add(
        HistoryCompacted(
            activation_id=r1.activation_id,
            marker_id=new_id(),
            summary="outputs summed up",
            archived_from=outputs[0].message_id,
            archived_through=outputs[-1].message_id,
            archived_count=5,
        )
    )
    r2 = await posted(add, "and now?")
    await add(r2)

    reader = SessionReader(store)
    snapshot = await reader.snapshot(session, r2)
    assert [s.text for s in snapshot.signals] == ["and now?"]
    assert snapshot == await load_session(store, session, r2)
    [kept] = reader._folds.values()
    assert kept.texts == {}
    assert not any("x" * 1_000 in text for text in texts(snapshot))


async def test_a_kept_fold_lets_go_of_signals_done_with_and_a_retry_still_finds_its_own(
    store: EventStore,
) -> None:
    """Every posted message's text went to its signal and stayed in the kept fold for ever
    (thousands of them, of up to a megabyte each, copied at every plan). The signals of the
    last requests stay (a retry names them again), and those not yet requested; older ones,
    and closed ones, go. A request naming one let go still gets it: the session read whole."""
    session, add = await opened(store)
    reader = SessionReader(store)
    requests = []
    for n in range(REQUESTS_KEPT + 8):
        r = await posted(add, f"message {n}: " + "x" * 10_000)
        await add(r)
        requests.append(r)
        snapshot = await reader.snapshot(session, r)
        assert [s.text for s in snapshot.signals] == [f"message {n}: " + "x" * 10_000]
    waiting = await posted(add, "not requested yet")
    closing = await posted(add, "closed unrequested")
    await add(SignalClosed(signal_id=closing.signal_ids[0], outcome=SignalOutcome.FAILED))
    latest = requests[-1]
    again = await reader.snapshot(session, latest)
    [kept] = reader._folds.values()
    assert set(kept.signals) == {
        *(r.signal_ids[0] for r in requests[-REQUESTS_KEPT:]),
        waiting.signal_ids[0],
    }
    assert again == await load_session(store, session, latest)

    retry = request(requests[0].signal_ids[0], waiting.signal_ids[0])  # the first one, again
    await add(retry)
    snapshot = await reader.snapshot(session, retry)
    assert [s.text for s in snapshot.signals] == ["message 0: " + "x" * 10_000, "not requested yet"]
    assert snapshot == await load_session(store, session, retry)


async def test_a_retrys_snapshot_names_its_earlier_attempts_and_who_wrote_what(
    store: EventStore,
) -> None:
    """A retry tells its earlier attempts' work on its message (after the message in the
    history) from an earlier activation's answer to something else (`runner.agent`)."""
    session, add = await opened(store)
    first = await posted(add, "look into it")
    await add(first)
    work = answer("looking", first.activation_id)
    await add(work)
    # A message handed to the running activation at a tool boundary (a P1): its retry
    # carries it too, and that activation worked on it.
    _, handed_signal = await stored(add, "and the logs too")
    await add(
        SignalsDelivered(activation_id=first.activation_id, signal_ids=(handed_signal.signal_id,))
    )
    retry = request(*first.signal_ids, handed_signal.signal_id).model_copy(update={"attempt": 2})
    await add(retry)
    other = await posted(add, "something else")
    await add(other)

    reader = SessionReader(store)
    snapshot = await reader.snapshot(session, retry)
    assert [(m.content, m.activation_id) for m in snapshot.history] == [
        ("look into it", None),
        ("looking", first.activation_id),
        ("and the logs too", None),
    ]
    assert snapshot.earlier_attempts == (first.activation_id,)
    assert snapshot == await load_session(store, session, retry)
    assert (await reader.snapshot(session, first)).earlier_attempts == ()
    assert (await reader.snapshot(session, other)).earlier_attempts == ()
    handed_only = request(handed_signal.signal_id)  # a retry of the handed message alone
    await add(handed_only)
    assert (await reader.snapshot(session, handed_only)).earlier_attempts == (
        first.activation_id,
        retry.activation_id,
    )


async def test_a_retrys_snapshot_names_its_messages_an_earlier_attempt_compacted(
    store: EventStore,
) -> None:
    """Attempt 1 compacted with its message archived; its retry is told so (the summary holds
    the message), a request whose message another activation archived is not."""
    session, add = await opened(store)
    user, user_signal = await stored(add, "delete the old branch")
    first = request(user_signal.signal_id)
    await add(first)
    work = answer("listing the branches", first.activation_id)
    await add(work)
    # A message posted while attempt 1 ran, not handed to it.
    later, later_signal = await stored(add, "and tag the release")
    archived_ids = (user.message_id, work.message_id, later.message_id)
    await add(
        HistoryCompacted(
            activation_id=first.activation_id,
            marker_id=new_id(),
            summary="asked to delete a branch; listed them",
            archived_from=archived_ids[0],
            archived_through=archived_ids[-1],
            archived_count=len(archived_ids),
            archived_ids=archived_ids,
        )
    )
    retry = request(*first.signal_ids).model_copy(update={"attempt": 2})
    await add(retry)
    tag = request(later_signal.signal_id)
    await add(tag)

    reader = SessionReader(store)
    snapshot = await reader.snapshot(session, retry)
    assert snapshot.earlier_attempts == (first.activation_id,)
    assert snapshot.summarized == (user.message_id,)
    assert snapshot == await load_session(store, session, retry)
    # Attempt 1 itself, and a request attempt 1 never worked on: nothing summarized for them.
    assert (await reader.snapshot(session, first)).summarized == ()
    assert (await reader.snapshot(session, tag)).summarized == ()
    assert (await load_session(store, session, tag)).summarized == ()
    # Both messages, retried together: only the one attempt 1 worked on is in the summary as
    # done; the other one it archived (posted meanwhile, never handed to it) is still asked.
    both = request(user_signal.signal_id, later_signal.signal_id).model_copy(update={"attempt": 3})
    await add(both)
    assert (await SessionReader(store).snapshot(session, both)).summarized == (user.message_id,)
    assert (await load_session(store, session, both)).summarized == (user.message_id,)


async def test_a_stored_request_not_found_is_an_error_not_a_snapshot_without_its_signals(
    store: EventStore,
) -> None:
    """A request the orchestrator folded from the log (`stored_at`: its message's sequence)
    is read from a replica holding the log up to there. Not found all the same, its plan
    fails (and is retried) rather than starting a runner on a batch without its signals —
    as the session standing without the request would give it. A request never stored (a
    dry run) is planned on the session as it stands."""
    session, add = await opened(store)
    r1 = await posted(add, "one")  # its message and signal stored, the request not
    at = await store.last_position()
    reader = SessionReader(store)

    with pytest.raises(SessionReadError, match=r1.activation_id):
        await reader.snapshot(session, r1, stored_at=at)
    with pytest.raises(SessionReadError):
        await load_session(store, session, r1, stored_at=at)

    dry = await reader.snapshot(session, r1)
    assert texts(dry) == ["one"]
    await add(r1)
    stored_r1 = await reader.snapshot(session, r1, stored_at=await store.last_position())
    assert [s.text for s in stored_r1.signals] == ["one"]
