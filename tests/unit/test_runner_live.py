"""The runner's live stream hands its last batch to the final call: what is on its way is let
finish (its chunks already left the buffer), what is buffered comes back numbered next, and
nothing is sent twice. The broker is an `httpx.MockTransport`: these are the client's own
decisions."""

from __future__ import annotations

import asyncio
import json

import httpx

from suzumio.runner.broker import BrokerClient
from suzumio.runner.live import MAX_CHUNKS_PER_BATCH, MAX_TEXT_PER_CHUNK, LiveStream

STEP = 5.0  # bounds a wait that would otherwise hang on a regression; not a timing claim


class Broker:
    def __init__(self) -> None:
        self.batches: list[tuple[int, list[str]]] = []
        self.arrived = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()

    async def answer(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.arrived.set()
        await self.release.wait()
        self.batches.append((body["batch"], [c["text"] for c in body["chunks"]]))
        return httpx.Response(200, json={"recorded": True})

    def client(self) -> BrokerClient:
        transport = httpx.MockTransport(self.answer)
        http = httpx.AsyncClient(base_url="http://broker", transport=transport)
        return BrokerClient("http://broker", "token", http=http)


async def test_what_is_buffered_is_the_last_batch_and_nothing_is_sent() -> None:
    broker = Broker()
    live = LiveStream(broker.client(), flush_seconds=60)
    live.start()
    live.event("state", "running")
    live.text("o")
    live.text("k")
    last = await asyncio.wait_for(live.finish(), STEP)
    assert last is not None
    assert (last.batch, [c.text for c in last.chunks]) == (0, ["running", "ok"])
    assert broker.batches == []
    await live.close()
    assert broker.batches == []  # handed over: not sent again on close


async def test_a_batch_on_its_way_finishes_and_what_came_after_is_the_next() -> None:
    broker = Broker()
    live = LiveStream(broker.client(), flush_seconds=0)
    live.start()
    broker.release.clear()
    live.text("first")
    await asyncio.wait_for(broker.arrived.wait(), STEP)  # batch 0 is on its way
    live.text("second")
    finishing = asyncio.create_task(live.finish())
    await asyncio.sleep(0)
    assert not finishing.done()  # waits for the batch on its way, never cancels it
    broker.release.set()
    last = await asyncio.wait_for(finishing, STEP)
    assert broker.batches == [(0, ["first"])]
    assert last is not None
    assert (last.batch, [c.text for c in last.chunks]) == (1, ["second"])


async def test_nothing_left_gives_none_and_more_than_a_batch_is_sent_here() -> None:
    broker = Broker()
    empty = LiveStream(broker.client(), flush_seconds=60)
    empty.start()
    assert await asyncio.wait_for(empty.finish(), STEP) is None

    many = LiveStream(broker.client(), flush_seconds=60)
    many.start()
    for i in range(MAX_CHUNKS_PER_BATCH + 1):
        many.event("state", str(i))
    assert await asyncio.wait_for(many.finish(), STEP) is None
    assert [(n, len(texts)) for n, texts in broker.batches] == [(0, MAX_CHUNKS_PER_BATCH), (1, 1)]


async def test_a_rest_with_too_much_text_for_one_batch_is_sent_in_batches_the_broker_takes() -> (
    None
):
    broker = Broker()
    live = LiveStream(broker.client(), flush_seconds=60)
    live.start()
    live.text("x" * (25 * MAX_TEXT_PER_CHUNK))  # 1.25M characters: more than a batch holds
    assert await asyncio.wait_for(live.finish(), STEP) is None
    sizes = [sum(len(t) for t in texts) for _, texts in broker.batches]
    assert [n for n, _ in broker.batches] == [0, 1]
    assert sizes == [20 * MAX_TEXT_PER_CHUNK, 5 * MAX_TEXT_PER_CHUNK]


async def test_a_notice_waits_its_allowance_and_a_token_brings_it_along() -> None:
    """The `running` notice may wait longer than a token: alone, it is not sent before its
    allowance; a token coming meanwhile takes it along in its own batch, at the token's time."""
    broker = Broker()
    live = LiveStream(broker.client(), flush_seconds=0)
    live.start()
    live.event("state", "running", within=60)
    for _ in range(20):  # the timer's turns, and more: it still waits for the notice's time
        await asyncio.sleep(0)
    assert broker.batches == []
    live.text("ok")
    await asyncio.wait_for(broker.arrived.wait(), STEP)
    await live.close()
    assert broker.batches == [(0, ["running", "ok"])]


async def test_a_token_after_a_notice_is_not_held_to_the_notice_time() -> None:
    """A notice's long allowance never holds a token back: a batch goes at the earliest time
    of what it holds."""
    broker = Broker()
    live = LiveStream(broker.client(), flush_seconds=0)
    live.start()
    live.event("state", "compacted", within=60)
    for _ in range(20):  # the timer waits for the notice's time now
        await asyncio.sleep(0)
    assert broker.batches == []
    live.event("tool_progress", "file_read")  # a token's allowance: the wait ends now
    await asyncio.wait_for(broker.arrived.wait(), STEP)
    await live.close()
    assert broker.batches == [(0, ["compacted", "file_read"])]
