"""Review of the gateway's live hub: LIVE is a memory stream, made again (numbering from 1)
after a NATS restart. A session watched across that must go on getting its live output on
this gateway, and its watchers be told the numbering they hold is void. Real NATS; the stream
is deleted and made again as `_keep_streams` does after a restart. And the tool-broker's
publishing of a live batch: what the bus cannot carry is refused before anything is sent."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

import anyio
import nats.errors
import pytest
from nats.aio.client import Client as NATS

from suzumio.contracts.broker import StreamBatch, StreamChunk
from suzumio.contracts.live import LiveChunk
from suzumio.contracts.subjects import Topology
from suzumio.gateway import livehub
from suzumio.gateway.api.problems import ApiError
from suzumio.gateway.feed import Cursor, SessionFeed
from suzumio.gateway.livehub import LiveHub
from suzumio.gateway.state import Gateway
from suzumio.platform.bus.jsapi import ensure_streams, stream_last_seq
from suzumio.toolbroker.access import Caller
from suzumio.toolbroker.problems import BrokerError
from suzumio.toolbroker.routes import _publish_live
from suzumio.toolbroker.state import Broker

STEP = 10.0  # bounds a wait that would otherwise hang on a regression; not a timing claim


class Watcher:
    def __init__(self) -> None:
        self.got: list[tuple[int, bytes]] = []
        self.restarts = 0
        self.changed = asyncio.Event()

    def deliver(self, seq: int, data: bytes) -> None:
        self.got.append((seq, data))
        self.changed.set()

    def restarted(self) -> None:
        self.restarts += 1
        self.changed.set()

    async def until(self, done: Callable[[], bool]) -> None:
        while not done():
            self.changed.clear()
            await self.changed.wait()


OLD = 50  # messages of the session before the restart: more than the test publishes after


async def _restart_live(nc: NATS, topology: Topology, hub: LiveHub, watcher: Watcher) -> None:
    js = nc.jetstream()
    await hub.join("s1", watcher)
    for i in range(OLD):
        await js.publish(topology.live_subject("s1"), f"old {i}".encode())
    await asyncio.wait_for(watcher.until(lambda: len(watcher.got) == OLD), STEP)
    await js.delete_stream(topology.live_stream)  # a NATS restart loses LIVE ...
    await ensure_streams(nc, topology.streams())  # ... and a service makes it again
    await js.publish(topology.live_subject("s1"), b"new 0")  # sequence 1 again


async def test_a_watcher_joining_after_live_is_made_again_gets_its_output(
    nc: NATS, topology: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one watcher stays, the session's channel stays: it must follow the new LIVE."""
    monkeypatch.setattr(livehub, "CHECK_SECONDS", 0.2)
    js = nc.jetstream()
    hub = LiveHub(nc, topology)
    try:
        await _restart_live(nc, topology, hub, Watcher())
        deadline = asyncio.get_running_loop().time() + 6
        got: list[tuple[int, bytes]] = []
        probe = 0
        while not got and asyncio.get_running_loop().time() < deadline:
            probe += 1  # a browser reconnecting: joins, waits a moment, gives up, again
            new = Watcher()
            after = await hub.join("s1", new)
            await js.publish(topology.live_subject("s1"), f"new {probe}".encode())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(new.until(lambda: bool(new.got)), 0.5)  # noqa: B023
            got = [(seq, data) for seq, data in new.got if seq > after]
            await hub.leave("s1", new)
        assert got == [(1 + probe, f"new {probe}".encode())]
    finally:
        await hub.close()


async def test_watchers_across_live_made_again_are_told_and_go_on(
    nc: NATS, topology: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(livehub, "CHECK_SECONDS", 0.2)
    js = nc.jetstream()
    hub = LiveHub(nc, topology)
    old = Watcher()
    try:
        await _restart_live(nc, topology, hub, old)
        await asyncio.wait_for(old.until(lambda: old.restarts == 1), STEP)
        await js.publish(topology.live_subject("s1"), b"new 1")
        await asyncio.wait_for(old.until(lambda: old.got[-1][1] == b"new 1"), STEP)
        assert old.got[-1][0] == 2  # numbered as LIVE numbers now
        assert old.restarts == 1
    finally:
        await hub.close()


async def test_live_as_usual_is_never_taken_for_made_again(
    nc: NATS, topology: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(livehub, "CHECK_SECONDS", 0.01)
    js = nc.jetstream()
    hub = LiveHub(nc, topology)
    watcher = Watcher()
    try:
        await hub.join("s1", watcher)
        for i in range(300):  # published while the hub keeps looking at LIVE
            await js.publish(topology.live_subject("s1"), str(i).encode())
            await js.publish(topology.live_subject("s2"), str(i).encode())
        await asyncio.wait_for(watcher.until(lambda: len(watcher.got) == 300), STEP)
        await asyncio.sleep(0.1)
    finally:
        await hub.close()
    assert watcher.restarts == 0
    assert [d for _, d in watcher.got] == [str(i).encode() for i in range(300)]


async def test_the_last_watcher_leaving_ends_the_subscription(nc: NATS, topology: Topology) -> None:
    hub = LiveHub(nc, topology)
    one, two = Watcher(), Watcher()
    await hub.join("s1", one)
    await hub.join("s1", two)
    await hub.leave("s1", one)
    assert "s1" in hub._channels
    await hub.leave("s1", two)
    assert hub._channels == {}
    await hub.close()


async def test_a_feed_closed_by_a_cancelled_task_still_leaves_the_hub_and_the_log(
    nc: NATS, topology: Topology
) -> None:
    """A client gone: Starlette cancels the response's task, and anyio cancels each await of
    its `finally` again. A feed closed so while another stream holds the session's lock
    (opening its channel again: NATS round trips) must still leave the hub — no chunk more handed to
    it — and end its log consumer, rather than stay a listener for good."""
    await ensure_streams(nc, topology.streams())
    hub = LiveHub(nc, topology)

    async def allowed() -> None:
        return None

    gw = cast("Gateway", SimpleNamespace(nc=nc, topology=topology, live=hub))
    subscriptions = len(nc._subs)
    feed = SessionFeed(gw, "s1", Cursor(), allowed)
    await feed.open()
    assert len(nc._subs) > subscriptions
    held = hub._turns.take("s1")  # another stream of the session, opening its channel again
    await held.__aenter__()
    try:
        with anyio.CancelScope() as gone:
            gone.cancel()
            await feed.close()
        assert gone.cancelled_caught
        assert all(feed not in c.listeners for c in hub._channels.values())
    finally:
        await held.__aexit__(None, None, None)
    async with asyncio.timeout(STEP):
        while hub._channels or len(nc._subs) > subscriptions:
            await asyncio.sleep(0.02)
    await hub.close()


async def test_a_chunk_fitting_the_bus_only_without_its_header_is_refused(
    nc: NATS, topology: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server counts a message's headers in max_payload and answers one over it by closing
    the connection (every request on it fails), so the broker's check must count the
    `Nats-Msg-Id` too. (The server here takes 8 MB, more than a batch may hold: the client is
    made to believe in a smaller bound, as a server of 1 MB would announce.)"""
    caller = cast(
        "Caller", SimpleNamespace(claims=SimpleNamespace(session_id="s1", activation_id="a1"))
    )
    broker = cast("Broker", SimpleNamespace(nc=nc, js=nc.jetstream(), topology=topology))
    body = StreamBatch(chunks=(StreamChunk(kind="text", text="x" * 100_000),), batch=7)
    chunk = LiveChunk(
        session_id="s1", activation_id="a1", kind="text", text="x" * 100_000, at=datetime.now(UTC)
    )
    payload = len(chunk.model_dump_json().encode())
    monkeypatch.setattr(nc, "_max_payload", payload + 10)  # fits alone, not with the header
    with pytest.raises(BrokerError) as refused:
        await _publish_live(broker, caller, body)
    assert refused.value.status == 413
    assert await stream_last_seq(nc, topology.live_stream) == 0  # nothing published


async def test_a_chunk_whose_data_is_no_unicode_is_refused_as_invalid(
    nc: NATS, topology: Topology
) -> None:
    """JSON reads `"\\ud800"` as a lone surrogate, which no bus message can carry: a 422 for
    the runner that sent it, not a 500 it would take for the platform's trouble and retry."""
    caller = cast(
        "Caller", SimpleNamespace(claims=SimpleNamespace(session_id="s1", activation_id="a1"))
    )
    broker = cast("Broker", SimpleNamespace(nc=nc, js=nc.jetstream(), topology=topology))
    raw = '{"chunks": [{"kind": "state", "data": {"note": "\\ud800"}}], "batch": 0}'
    body = StreamBatch.model_validate(json.loads(raw))  # as FastAPI reads a body
    with pytest.raises(BrokerError) as refused:
        await _publish_live(broker, caller, body)
    assert refused.value.status == 422
    assert await stream_last_seq(nc, topology.live_stream) == 0


async def test_a_gateway_shutting_down_ends_its_streams_saying_so(
    nc: NATS, topology: Topology
) -> None:
    """On drain the hub closes first: its feeds are told, send what they hold and end with
    a 503 naming why — not go quiet until the server cuts them without a word."""
    await ensure_streams(nc, topology.streams())
    hub = LiveHub(nc, topology)

    async def allowed() -> None:
        return None

    gw = cast("Gateway", SimpleNamespace(nc=nc, topology=topology, live=hub))
    feed = SessionFeed(gw, "s1", Cursor(), allowed)
    await feed.open()
    try:
        await nc.jetstream().publish(topology.live_subject("s1"), b'{"text": "before"}')
        items = feed.items()
        first = await asyncio.wait_for(anext(items), STEP)
        assert first is not None
        assert first.event == "live"
        await hub.close()
        end = await asyncio.wait_for(anext(items), STEP)
        assert end is not None
        assert (end.event, json.loads(end.data)["status"]) == ("end", 503)
        assert "shutting down" in json.loads(end.data)["detail"]
        # A stream opening while the gateway drains is refused, not left to go quiet.
        late = SessionFeed(gw, "s2", Cursor(), allowed)
        with pytest.raises(ApiError) as refused:
            await late.open()
        assert refused.value.status == 503
    finally:
        await feed.close()


async def test_a_channel_whose_last_listener_could_not_leave_is_dropped_not_reopened(
    nc: NATS, topology: Topology
) -> None:
    """A feed's cleanup lets its listener go at once and gives up on the hub's lock after a
    while: the channel it leaves without listeners must not be kept (and reopened on each
    new LIVE) for good."""
    hub = LiveHub(nc, topology)
    watcher = Watcher()
    try:
        await _restart_live(nc, topology, hub, watcher)
        hub.forget("s1", watcher)  # its `leave` never got the lock
        await hub._follow_live()
        assert hub._channels == {}
    finally:
        await hub.close()


async def test_a_channel_left_without_listeners_on_the_current_live_is_dropped(
    nc: NATS, topology: Topology
) -> None:
    """Not only on a LIVE made again: a channel whose last listener went without leaving (its
    `leave` gave up on the lock behind a slow NATS, or its feed's cleanup failed first) kept
    its server consumer and took its session's chunks for good, nobody reading them."""
    hub = LiveHub(nc, topology)
    watcher, stays = Watcher(), Watcher()
    try:
        await hub.join("s1", watcher)
        await hub.join("s2", stays)
        channel = hub._channels["s1"]
        hub.forget("s1", watcher)  # its `leave` never got the lock
        await hub._follow_live()
        assert list(hub._channels) == ["s2"]  # the one still listened to stays
        assert channel.sub is not None
        with pytest.raises(nats.errors.BadSubscriptionError):
            await channel.sub.unsubscribe()  # unsubscribed already
    finally:
        await hub.close()


async def test_live_output_held_in_memory_is_bounded_in_bytes(nc: NATS, topology: Topology) -> None:
    """LIVE is in the NATS server's memory: an operator may bound what sandboxes publish there
    as a whole (`SUZUMIO_LIVE_MAX_BYTES`), the oldest chunks going first — one looping on the
    stream route fills gigabytes for the ten minutes LIVE keeps them. (Unbounded unless set:
    JetStream reserves the bound up front, for every namespace's LIVE.)"""
    small = Topology(namespace=topology.namespace, live_max_bytes=1024 * 1024)
    await ensure_streams(nc, small.streams())
    js = nc.jetstream()
    payload = b"x" * 64 * 1024
    for _ in range(40):  # 2.5 MB
        await js.publish(small.live_subject("s1"), payload)
    info = await js.stream_info(small.live_stream)
    assert info.config.max_bytes == 1024 * 1024
    assert info.state.bytes <= 1024 * 1024
    assert info.state.first_seq > 1  # the oldest went
    assert info.state.last_seq == 40


class SlowToOpen(LiveHub):
    """A hub whose channel of `slow` opens only when let: NATS slow to answer for it."""

    def __init__(self, nc: NATS, topology: Topology, slow: str) -> None:
        super().__init__(nc, topology)
        self.slow, self.opening, self.let = slow, asyncio.Event(), asyncio.Event()

    async def _open(self, session_id: str, listeners: set[livehub.LiveListener]) -> Any:
        if session_id == self.slow:
            self.opening.set()
            await self.let.wait()
        return await super()._open(session_id, listeners)


async def test_a_session_slow_to_open_holds_up_no_other_sessions_watchers(
    nc: NATS, topology: Topology
) -> None:
    hub = SlowToOpen(nc, topology, "s1")
    one, two, three = Watcher(), Watcher(), Watcher()
    try:
        slow = asyncio.create_task(hub.join("s1", one))
        await asyncio.wait_for(hub.opening.wait(), STEP)
        # Another session's watchers join and leave while s1's channel is still opening.
        await asyncio.wait_for(hub.join("s2", two), STEP)
        await asyncio.wait_for(hub.leave("s2", two), STEP)
        assert not slow.done()
        waiting = asyncio.create_task(hub.join("s1", three))  # the same session waits its turn
        hub.let.set()
        await asyncio.wait_for(asyncio.gather(slow, waiting), STEP)
        assert set(hub._channels) == {"s1"}
        assert hub._channels["s1"].listeners == {one, three}  # one channel, both on it
        await hub.leave("s1", one)
        await hub.leave("s1", three)
        assert hub._channels == {}
        assert len(hub._turns) == 0  # nothing kept of the sessions gone
    finally:
        await hub.close()


async def test_a_stream_joining_while_the_gateway_shuts_down_is_refused(
    nc: NATS, topology: Topology
) -> None:
    """A join that passed the shutdown check, then opened its session's channel while the
    hub closed: the channel was stored after `close` told everyone, and the stream never
    heard of the shutdown (it ran on until the server cut it, with no `end`)."""
    hub = SlowToOpen(nc, topology, "s1")
    joining = asyncio.create_task(hub.join("s1", Watcher()))
    await asyncio.wait_for(hub.opening.wait(), STEP)
    closing = asyncio.create_task(hub.close())
    await asyncio.sleep(0.05)
    hub.let.set()
    await asyncio.wait_for(closing, STEP)
    with pytest.raises(ApiError) as refused:
        await asyncio.wait_for(joining, STEP)
    assert refused.value.status == 503
    assert hub._channels == {}
