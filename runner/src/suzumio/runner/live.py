"""Live output, batched: the model's tokens go to the broker in small batches on a timer, never
one request per token (DESIGN.md §7). A slow or failing broker never stalls the model stream:
the buffer keeps growing until the next flush, and live output is best-effort by design (the
durable record is the history).

A chunk waits at most its allowance before it is sent: a token, `FLUSH_SECONDS`; a notice no
one waits on, such as the `running` state at an activation's start, up to `NOTICE_SECONDS`
— so that an answer that comes within it brings the notice along (often in the final call,
with no batch of its own), while one that takes longer, as most do, still shows it in time."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from suzumio.contracts.broker import StreamBatch, StreamChunk
from suzumio.runner.broker import BrokerClient, FencedError
from suzumio.runner.log import log

FLUSH_SECONDS = 0.02
NOTICE_SECONDS = 0.25
MAX_TEXT_PER_CHUNK = 50_000
MAX_CHUNKS_PER_BATCH = 1_000
MAX_TEXT_PER_BATCH = 1_000_000  # of the broker's 2 M bound on text and data a batch
CLOSE_TIMEOUT = 30.0


class LiveStream:
    def __init__(self, broker: BrokerClient, flush_seconds: float = FLUSH_SECONDS) -> None:
        self._broker = broker
        self._flush_seconds = flush_seconds
        self._text: list[str] = []
        self._started: float | None = None  # when the oldest buffered token arrived
        self._others: list[StreamChunk] = []
        self._wake = asyncio.Event()
        self._due: float | None = None  # the loop's time by which the buffer goes
        self._task: asyncio.Task[None] | None = None
        self.fenced = False
        self.chunks_sent = 0
        self._batches = 0  # numbered, so the broker publishes a retried batch once
        self._sending = False
        self._closing = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def text(self, delta: str) -> None:
        if delta:
            if not self._text:
                self._started = time.time()
                self._send_within(self._flush_seconds)
            self._text.append(delta)

    def event(self, kind: str, text: str = "", *, within: float | None = None, **data: Any) -> None:
        """A chunk of `kind`, sent within `within` seconds (a token's allowance by default)."""
        self._take_text()
        # A tool's name is the model's to choose: any length, any characters.
        text = _whole(text)[:MAX_TEXT_PER_CHUNK]
        self._others.append(StreamChunk(kind=kind, text=text, data=data))  # type: ignore[arg-type]
        self._send_within(self._flush_seconds if within is None else within)

    def _send_within(self, seconds: float) -> None:
        due = asyncio.get_running_loop().time() + seconds
        if self._due is None or due < self._due:
            self._due = due
            self._wake.set()  # the timer takes the earlier time

    def _take_text(self) -> None:
        if self._text:
            text = _whole("".join(self._text))
            self._text.clear()
            started = self._started or time.time()
            for i in range(0, len(text), MAX_TEXT_PER_CHUNK):
                self._others.append(
                    StreamChunk(
                        kind="text",
                        text=text[i : i + MAX_TEXT_PER_CHUNK],
                        data={"first_token_at": started},
                    )
                )

    async def flush(self) -> None:
        self._take_text()
        self._due = None
        batch, self._others = self._others, []
        if not batch or self.fenced:
            return
        try:
            for part in _batches(batch):
                self._batches += 1
                await self._broker.stream(part, self._batches - 1)
                self.chunks_sent += len(part)
        except FencedError:
            self.fenced = True
        except Exception as exc:  # best-effort: the history has the durable record
            log("live.flush_failed", error=repr(exc), chunks=len(batch))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closing:
            await self._wake.wait()
            self._wake.clear()
            # Gather a batch until the earliest chunk's time, which one coming meanwhile with
            # a shorter allowance brings forward.
            while self._due is not None and (left := self._due - loop.time()) > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await self._wake.wait()
                self._wake.clear()
            self._due = None
            self._sending = True
            try:
                await self.flush()
            except Exception as exc:  # the timer must outlive any batch: else all after it waits
                log("live.flush_failed", error=repr(exc))
            finally:
                self._sending = False

    async def close(self) -> None:
        """Send what is buffered."""
        await self._stop()
        await self.flush()

    async def finish(self) -> StreamBatch | None:
        """Stop, and hand over what is buffered as the last batch (numbered like the others)
        for the activation's final call to bring along; None when nothing is left or the
        stream is fenced, or when the rest is more than one batch — then it is sent here."""
        await self._stop()
        self._take_text()
        batch = self._others
        if not batch or self.fenced:
            return None
        if len(_batches(batch)) > 1:
            await self.flush()
            return None
        self._others = []
        self._batches += 1
        return StreamBatch(chunks=tuple(batch), batch=self._batches - 1)

    async def _stop(self) -> None:
        """End the timer. A batch on its way is let finish, never cancelled: its chunks were
        taken from the buffer already, so cancelling would lose them; a timer still gathering
        one is cancelled, and the caller sends what it gathered."""
        task = self._task
        if task is None:
            return
        self._closing = True  # a batch on its way is the timer's last
        if not self._sending:
            task.cancel()
        _, pending = await asyncio.wait({task}, timeout=CLOSE_TIMEOUT)
        if pending:
            task.cancel()
            await asyncio.wait({task})
        self._task = None  # only now: a stop cancelled meanwhile is waited for again


def _whole(text: str) -> str:
    """`text` as valid Unicode, which a chunk must be: a provider may stream an emoji's UTF-16
    halves apart (JSON escapes, each decoding to a lone surrogate), and a chunk holding one is
    refused, so the pair is joined when both are here and a lone half becomes U+FFFD."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def _batches(chunks: list[StreamChunk]) -> list[list[StreamChunk]]:
    """In order, in batches the broker takes: at most so many chunks and so much text."""
    batches: list[list[StreamChunk]] = []
    text = 0
    for chunk in chunks:
        if (
            not batches
            or len(batches[-1]) >= MAX_CHUNKS_PER_BATCH
            or text + len(chunk.text) > MAX_TEXT_PER_BATCH
        ):
            batches.append([])
            text = 0
        batches[-1].append(chunk)
        text += len(chunk.text)
    return batches
