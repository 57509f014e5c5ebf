"""Review of the runner's live stream: text a model streams is sent whatever its characters
(a provider may stream an emoji's UTF-16 halves apart, JSON escapes decoding to lone
surrogates), and a tool's name of any length is a progress chunk, not a failed call. The
broker is an `httpx.MockTransport`."""

from __future__ import annotations

import asyncio
import json

import httpx

from suzumio.runner.broker import BrokerClient
from suzumio.runner.live import MAX_TEXT_PER_CHUNK, LiveStream

STEP = 5.0  # bounds a wait that would otherwise hang on a regression; not a timing claim


class Broker:
    def __init__(self) -> None:
        self.texts: list[str] = []
        self.changed = asyncio.Event()

    async def answer(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.texts += [c["text"] for c in body["chunks"]]
        self.changed.set()
        return httpx.Response(200, json={"recorded": True})

    def client(self) -> BrokerClient:
        transport = httpx.MockTransport(self.answer)
        http = httpx.AsyncClient(base_url="http://broker", transport=transport)
        return BrokerClient("http://broker", "token", http=http)

    async def until(self, text: str) -> None:
        while text not in "".join(self.texts):
            self.changed.clear()
            await self.changed.wait()


async def test_a_lone_surrogate_does_not_stop_the_stream() -> None:
    broker = Broker()
    live = LiveStream(broker.client(), flush_seconds=0)
    live.start()
    live.text("half an emoji \ud83d")
    await asyncio.wait_for(broker.until("half an emoji \ufffd"), STEP)
    live.text(" and what follows")  # still streamed as it comes, not held until the end
    await asyncio.wait_for(broker.until(" and what follows"), STEP)
    await live.close()


async def test_an_emoji_streamed_in_halves_arrives_whole() -> None:
    broker = Broker()
    live = LiveStream(broker.client(), flush_seconds=60)
    live.start()
    live.text("\ud83d")
    live.text("\ude00")
    await live.close()
    assert broker.texts == ["\U0001f600"]


async def test_an_event_with_any_text_is_taken() -> None:
    broker = Broker()
    live = LiveStream(broker.client(), flush_seconds=60)
    live.start()
    live.text("before")
    live.event("tool_progress", "x" * (3 * MAX_TEXT_PER_CHUNK), call_id="c1", phase="started")
    live.event("tool_progress", "bad\udcff", call_id="c2", phase="started")
    await live.close()
    assert broker.texts == ["before", "x" * MAX_TEXT_PER_CHUNK, "bad\ufffd"]
