"""Writing a stream of chunks to a file without holding the event loop.

A `write()` of a chunk to a file is quick while the page cache takes it, and blocks for as long
as the kernel throttles a writer under dirty-page pressure — the moment a service writing a
large upload or copy-in on its event loop stalls every other request it serves. Chunks are
gathered to `batch` bytes and written in a thread; a whole stream smaller than that is
written where it is, in one call (no thread hop for a small file)."""

from __future__ import annotations

import asyncio
from typing import IO

BATCH_BYTES = 1 << 20


class OffLoopWriter:
    def __init__(self, sink: IO[bytes], batch: int = BATCH_BYTES) -> None:
        self._sink = sink
        self._batch = batch
        self._pending: list[bytes] = []
        self._size = 0
        self._threaded = False  # a batch went to a thread: the rest must follow it, in order

    async def write(self, chunk: bytes) -> None:
        self._pending.append(chunk)
        self._size += len(chunk)
        if self._size >= self._batch:
            self._threaded = True
            await asyncio.to_thread(self._sink.write, self._take())

    async def close(self) -> None:
        """Write what is left (the caller closes the sink)."""
        if not self._size:
            return
        if self._threaded:
            await asyncio.to_thread(self._sink.write, self._take())
        else:
            self._sink.write(self._take())

    def _take(self) -> bytes:
        data = b"".join(self._pending)
        self._pending.clear()
        self._size = 0
        return data
