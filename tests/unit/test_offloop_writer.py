"""`OffLoopWriter`: a large stream's chunks reach the file in order, written in threads (never
on the event loop's); a small one is written where it is, in one call."""

from __future__ import annotations

import io
import os
import threading

from suzumio.platform.offloop import OffLoopWriter


class Recording(io.BytesIO):
    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.threads.append(threading.current_thread().name)
        return super().write(data)


async def test_a_large_stream_is_written_in_order_off_the_event_loop() -> None:
    sink = Recording()
    writer = OffLoopWriter(sink, batch=256 * 1024)
    chunks = [os.urandom(64 * 1024) for _ in range(40)]
    for chunk in chunks:
        await writer.write(chunk)
    await writer.close()
    assert sink.getvalue() == b"".join(chunks)
    assert len(sink.threads) == 10
    loop_thread = threading.current_thread().name
    assert loop_thread not in sink.threads


async def test_a_small_stream_is_written_at_once_in_one_call() -> None:
    sink = Recording()
    writer = OffLoopWriter(sink, batch=256 * 1024)
    for chunk in (b"a" * 10, b"b" * 20):
        await writer.write(chunk)
    assert sink.getvalue() == b""
    await writer.close()
    assert sink.getvalue() == b"a" * 10 + b"b" * 20
    assert sink.threads == [threading.current_thread().name]
