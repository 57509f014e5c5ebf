"""A stream's feed that falls behind the shared live hub ends instead of slowing the others."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest

from suzumio.gateway import feed as feed_module
from suzumio.gateway.api.problems import ApiError
from suzumio.gateway.feed import QUEUE_BYTES, QUEUE_SIZE, Cursor, SessionFeed
from suzumio.gateway.state import Gateway
from suzumio.platform.errors import PlatformError


async def never_refused() -> None:
    return None


def reading_the_log(
    monkeypatch: pytest.MonkeyPatch, read: Callable[..., AsyncIterator[Any]], cursor: Cursor
) -> SessionFeed:
    """A feed of s1 opened where the log ended at 9, whose reading of it is `read` (a
    stand-in for `iter_subject`)."""
    monkeypatch.setattr(feed_module, "iter_subject", read)
    topology = SimpleNamespace(
        events_stream="EVENTS", event_subject=lambda aggregate, i: f"ev.{aggregate}.{i}"
    )
    gateway = cast("Gateway", SimpleNamespace(nc=None, topology=topology))
    feed = SessionFeed(gateway, "s1", cursor, never_refused)
    feed._log_end = 9
    return feed


async def test_a_feed_that_falls_behind_ends_with_a_reason_and_keeps_its_cursor() -> None:
    gateway = cast("Gateway", cast("Any", object()))  # this path never touches the gateway
    feed = SessionFeed(gateway, "s1", Cursor(events=0, live=0), never_refused)
    for seq in range(1, 4):
        feed.deliver(seq, b'{"text": "ok"}')
    items = feed.items()
    first = await anext(items)
    assert first is not None
    assert (first.event, first.cursor) == ("live", "0.1")

    for seq in range(4, 4 + QUEUE_SIZE):  # two already queued: the last ones do not fit
        feed.deliver(seq, b"{}")
    rest = [item async for item in items]
    last = rest[-1]
    assert last is not None
    assert last.event == "end"
    assert json.loads(last.data)["status"] == 503
    assert feed.cursor.live == 1  # a reconnect resumes right after what was sent


async def test_catching_up_through_a_long_log_while_live_output_comes_is_not_falling_behind() -> (
    None
):
    gateway = cast("Gateway", cast("Any", object()))
    feed = SessionFeed(gateway, "s1", Cursor(events=0, live=0), never_refused)
    envelope = json.dumps({"type": "session.message_appended"}).encode()
    for seq in range(1, QUEUE_SIZE):  # a long log, read from the start
        feed.take_event(seq, envelope)
    for seq in range(1, 101):  # and an activation's output meanwhile
        feed.deliver(seq, b"{}")

    items = feed.items()
    kinds = []
    for _ in range(QUEUE_SIZE - 1 + 100):
        item = await anext(items)
        assert item is not None  # no keep-alive: everything is queued already
        kinds.append(item.event)

    assert kinds.count("session.message_appended") == QUEUE_SIZE - 1
    assert kinds.count("live") == 100
    assert "end" not in kinds
    assert feed.cursor.events == QUEUE_SIZE - 1
    assert feed.cursor.live == 100


async def test_a_feed_told_live_was_made_again_sends_what_it_has_then_ends() -> None:
    """Its cursor is in LIVE's old numbering: the stream ends, and the client's reconnect
    reads the new LIVE from its start (what it got before the hub noticed included)."""
    gateway = cast("Gateway", cast("Any", object()))  # this path never touches the gateway
    feed = SessionFeed(gateway, "s1", Cursor(events=0, live=0), never_refused)
    feed.deliver(1, b'{"text": "before"}')
    feed.restarted()
    feed.deliver(1, b'{"text": "after"}')  # the new numbering: never sent under the old
    items = [item async for item in feed.items()]
    assert [i.event for i in items if i is not None] == ["live", "end"]
    end = items[-1]
    assert end is not None
    assert json.loads(end.data) == {
        "status": 503,
        "detail": "live output was restarted; reconnect with Last-Event-ID",
    }
    assert feed.cursor.live == 1


async def test_a_feed_holding_too_many_bytes_of_live_output_ends_like_one_too_many_chunks() -> None:
    """A chunk may hold megabytes: a slow client is bounded in bytes too, not only in chunks
    (1,024 of 2 MB each would be 2 GB held for one client)."""
    gateway = cast("Gateway", cast("Any", object()))  # this path never touches the gateway
    feed = SessionFeed(gateway, "s1", Cursor(events=0, live=0), never_refused)
    items = feed.items()
    feed.deliver(1, b"{}")
    first = await anext(items)
    assert first is not None
    assert first.cursor == "0.1"

    big = b"x" * (QUEUE_BYTES // 4)
    for seq in range(2, 7):  # the fifth does not fit
        feed.deliver(seq, big)
    rest = [item async for item in items]  # ends at once: nothing more is waited for
    last = rest[-1]
    assert last is not None
    assert last.event == "end"
    assert json.loads(last.data)["status"] == 503
    assert feed.cursor.live == 1  # a reconnect resumes right after what was sent


async def test_log_events_queued_for_a_client_are_bounded_in_bytes_not_only_in_count() -> None:
    """A log message may be as large as the bus carries: a client that stops reading holds
    at most QUEUE_BYTES of them here (a thousand messages of megabytes each would be
    gigabytes). One more, and the client fell behind: it resumes from its cursor."""
    gateway = cast("Gateway", cast("Any", object()))
    feed = SessionFeed(gateway, "s1", Cursor(events=0, live=0), never_refused)
    big = json.dumps({"type": "session.message_appended", "text": "x" * (QUEUE_BYTES // 4)})
    items = feed.items()
    feed.take_event(1, big.encode())
    first = await anext(items)
    assert first is not None
    assert first.cursor == "1.0"

    for seq in range(2, 6):  # each a little over a fourth of the budget: the fourth does not fit
        feed.take_event(seq, big.encode())
    rest = [item async for item in items]  # ends at once: nothing more is waited for
    assert [i.event for i in rest if i is not None] == ["end"]
    last = rest[-1]
    assert last is not None
    assert json.loads(last.data)["status"] == 503
    assert feed.cursor.events == 1  # a reconnect resumes right after what was sent


async def test_a_log_that_cannot_be_read_up_to_where_its_consumer_began_ends_the_feed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the cursor names of the log before the feed opened is read from the stream; a
    failed read ends the stream (503) with the cursor of what was sent, not mid-stream with
    no `end`. (The reading is a stand-in that fails after one message.)"""

    async def one_then_fails(*_: Any, **__: Any) -> AsyncIterator[Any]:
        yield SimpleNamespace(seq=4, data=b'{"type": "session.message_appended"}')
        raise PlatformError("direct get failed with status 503")

    feed = reading_the_log(monkeypatch, one_then_fails, Cursor(events=2, live=0))
    items = [item async for item in feed.items()]
    assert [(i.event, i.cursor) for i in items if i is not None] == [
        ("session.message_appended", "4.0"),
        ("end", None),
    ]
    end = items[-1]
    assert end is not None
    assert json.loads(end.data) == {"status": 503, "detail": feed_module.HISTORY_FAILED}
    assert feed.cursor.events == 4


async def test_a_backlog_the_stream_cannot_serve_up_to_the_join_point_ends_the_feed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replica that holds LIVE only short of where the hub took over answers 412 (the
    read-after-write rule of NATS): LIVE was made again meanwhile. The stream ends with a
    503 to resume from, not with an error cut mid-stream. (The reading is a stand-in here:
    one NATS server never answers 412.)"""

    async def refused(*_: Any, **__: Any) -> AsyncIterator[Any]:
        for _ in ():  # an async generator that yields nothing before it fails
            yield _
        raise PlatformError("direct get failed with status 412")

    monkeypatch.setattr(feed_module, "iter_subject", refused)
    topology = SimpleNamespace(live_stream="LIVE", live_subject=lambda s: f"live.{s}")
    gateway = cast("Gateway", SimpleNamespace(nc=None, topology=topology))
    feed = SessionFeed(gateway, "s1", Cursor(events=0, live=2), never_refused)
    feed._joined_at = 9
    [end] = [item async for item in feed.items()]
    assert end is not None
    assert (end.event, json.loads(end.data)["status"]) == ("end", 503)


async def test_live_output_and_a_shutdown_reach_a_client_catching_up_between_log_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A catch-up through a long log on a busy session: the live output that comes meanwhile
    goes between log messages (held until the end, it overflowed the feed's queue), a log
    event stored meanwhile comes after the catch-up, and a gateway shutting down ends the
    stream after the message being sent. (The reading is a stand-in.)"""
    envelope = b'{"type": "session.message_appended"}'
    feed: SessionFeed

    async def log_read(*_: Any, **__: Any) -> AsyncIterator[Any]:
        yield SimpleNamespace(seq=3, data=envelope)
        feed.deliver(1, b'{"text": "meanwhile"}')
        feed.take_event(12, envelope)  # stored after the feed opened
        yield SimpleNamespace(seq=5, data=envelope)
        feed.deliver(2, b'{"text": "then"}')
        yield SimpleNamespace(seq=8, data=envelope)
        feed.closing()
        yield SimpleNamespace(seq=9, data=envelope)

    feed = reading_the_log(monkeypatch, log_read, Cursor(events=0, live=0))
    items = [item async for item in feed.items()]
    # Each stand-in's step runs as the next message is read: what it did goes after that one.
    assert [(i.event, i.cursor) for i in items if i is not None] == [
        ("session.message_appended", "3.0"),
        ("session.message_appended", "5.0"),
        ("live", "5.1"),
        ("session.message_appended", "8.1"),
        ("live", "8.2"),
        ("session.message_appended", "9.2"),
        ("end", None),  # the event stored meanwhile was not sent: the cursor says so
    ]
    end = items[-1]
    assert end is not None
    assert json.loads(end.data)["detail"] == feed_module._ENDINGS["closing"]


async def test_log_events_stored_during_a_catch_up_follow_it_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    envelope = b'{"type": "session.message_appended"}'
    feed: SessionFeed

    async def log_read(*_: Any, **__: Any) -> AsyncIterator[Any]:
        yield SimpleNamespace(seq=3, data=envelope)
        feed.take_event(12, envelope)  # stored after the feed opened
        feed.take_event(13, envelope)
        yield SimpleNamespace(seq=5, data=envelope)

    feed = reading_the_log(monkeypatch, log_read, Cursor(events=0, live=0))
    items = feed.items()
    got = [await anext(items) for _ in range(4)]
    assert [i.cursor for i in got if i is not None] == ["3.0", "5.0", "12.0", "13.0"]
    feed.deliver(1, b"{}")
    after = await anext(items)  # the queue is drained of what was held: it goes on
    assert after is not None
    assert after.cursor == "13.1"


async def test_a_recheck_that_cannot_be_made_for_a_moment_does_not_end_the_stream() -> None:
    """A Postgres or NATS blip in the access check cut every stream of the gateway at once,
    with no `end`. The stream goes on and checks again soon; a check that keeps failing
    for two intervals ends it (503), and a refusal ends it as ever."""
    gateway = cast("Gateway", cast("Any", object()))  # this path never touches the gateway
    # The log asked while a read model is frozen, and the session service did not answer.
    outcomes: list[BaseException | None] = [ApiError(503, "the log did not answer"), None]
    made: list[str] = []

    async def flaky() -> None:
        outcome = outcomes.pop(0) if outcomes else OSError("still away")
        made.append("failed" if outcome is not None else "passed")
        if outcome is not None:
            raise outcome

    feed = SessionFeed(gateway, "s1", Cursor(events=0, live=0), flaky, recheck_seconds=0.05)
    got: list[tuple[str, list[str]]] = []
    ended: list[bytes] = []

    async def watch() -> None:
        async for item in feed.items():
            if item is not None:
                got.append((item.event, list(made)))
                ended.append(item.data)

    watching = asyncio.create_task(watch())
    while made != ["failed"]:
        await asyncio.sleep(0.005)
    feed.deliver(1, b'{"text": "after a failed check"}')
    await asyncio.wait_for(watching, 5)
    assert got[0] == ("live", ["failed"])  # the failed check did not end the stream
    event, checks = got[-1]
    assert event == "end"
    assert checks[:2] == ["failed", "passed"]  # retried soon, and passed
    assert len(checks) >= 4  # ended only after failing for two intervals since the pass
    assert json.loads(ended[-1]) == {"status": 503, "detail": feed_module.RECHECK_FAILED}
