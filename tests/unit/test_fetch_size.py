"""How many events a projector (or a rebuild's reader) asks for at once: a fetch is bounded by
count at the server, so the count follows the size of the events — a thousand of a megabyte
each were a gigabyte in the session service's memory at once."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from suzumio.platform.projections.reader import BATCH_BYTES, FetchSize


def msgs(count: int, size: int) -> list[Any]:
    return [SimpleNamespace(data=b"x" * size) for _ in range(count)]


def test_small_events_come_a_full_batch_at_a_time_large_ones_by_their_bytes() -> None:
    size = FetchSize(1_000)
    assert size.next == FetchSize.FIRST  # nothing known yet of what comes
    size.took(msgs(32, 600))  # the usual event: a few hundred bytes
    assert size.next == 1_000
    size.took(msgs(1_000, 1 << 20))  # a run of long messages
    assert size.next == BATCH_BYTES // (1 << 20)
    assert size.next * (1 << 20) <= BATCH_BYTES
    size.took(msgs(1, 64 << 20))  # larger than the budget alone: one at a time
    assert size.next == 1
    size.took([])  # nothing came: as before
    assert size.next == 1
    size.took(msgs(1, 500))
    assert size.next == 1_000
