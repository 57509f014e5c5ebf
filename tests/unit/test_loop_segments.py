"""Tool-round segmentation and the segment runner (DESIGN.md §9, Appendix A)."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path, PurePath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suzumio.runner.loop.segments import CallFailure, PlannedCall, run_segments, segment

# Events only order the steps; this bounds a wait that would otherwise hang on a regression.
STEP = 5.0


def read(index: int, *paths: str) -> PlannedCall:
    return PlannedCall(index, "read", tuple(Path(p) for p in paths))


def write(index: int, *paths: str) -> PlannedCall:
    return PlannedCall(index, "write", tuple(Path(p) for p in paths))


def alone(index: int) -> PlannedCall:
    return PlannedCall(index, "exclusive")


SEGMENT_CASES = {
    "no calls, no segments": ([], [], 8),
    "consecutive reads share a segment": ([read(0), read(1), read(2)], [[0, 1, 2]], 8),
    "reads past the parallel limit start a new segment": (
        [read(i) for i in range(10)],
        [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9]],
        8,
    ),
    "the limit counts writes too": (
        [write(0, "/w/a"), write(1, "/w/b"), read(2)],
        [[0, 1], [2]],
        2,
    ),
    "a write on disjoint paths joins reads without paths": (
        [read(0), write(1, "/w/a"), read(2)],
        [[0, 1, 2]],
        8,
    ),
    "writes on disjoint paths share a segment": (
        [write(0, "/w/a"), write(1, "/w/b")],
        [[0, 1]],
        8,
    ),
    "a write to the same path starts a new segment": (
        [write(0, "/w/a"), write(1, "/w/a")],
        [[0], [1]],
        8,
    ),
    "a write inside a reserved directory starts a new segment": (
        [write(0, "/w/dir"), write(1, "/w/dir/file")],
        [[0], [1]],
        8,
    ),
    "a write to a parent of a reserved path starts a new segment": (
        [write(0, "/w/dir/file"), write(1, "/w/dir")],
        [[0], [1]],
        8,
    ),
    "a shared name prefix is not nesting": (
        [write(0, "/w/ab"), write(1, "/w/a")],
        [[0, 1]],
        8,
    ),
    "any of a call's paths can overlap": (
        [write(0, "/w/a", "/w/b"), write(1, "/w/c", "/w/b")],
        [[0], [1]],
        8,
    ),
    "a conflict closes the segment; later calls join the new one": (
        [write(0, "/w/a"), write(1, "/w/b"), write(2, "/w/a"), write(3, "/w/b")],
        [[0, 1], [2, 3]],
        8,
    ),
    "a read of a reserved path waits for the write": (
        [write(0, "/w/a"), read(1, "/w/a")],
        [[0], [1]],
        8,
    ),
    "a write to a path read in the segment waits for the read": (
        [read(0, "/w/dir"), write(1, "/w/dir/x")],
        [[0], [1]],
        8,
    ),
    "reads of the same path do not conflict": (
        [read(0, "/w/a"), read(1, "/w/a")],
        [[0, 1]],
        8,
    ),
    "exclusive calls run alone and split the reads around them": (
        [read(0), alone(1), read(2), alone(3), alone(4)],
        [[0], [1], [2], [3], [4]],
        8,
    ),
    "a write with no known paths runs alone": (
        [read(0), write(1), read(2)],
        [[0], [1], [2]],
        8,
    ),
    "a parallel limit of one serialises everything": (
        [read(0), read(1)],
        [[0], [1]],
        1,
    ),
}


@pytest.mark.parametrize(
    ("calls", "expected", "max_parallel"), SEGMENT_CASES.values(), ids=SEGMENT_CASES.keys()
)
def test_segment(calls, expected, max_parallel):
    assert segment(calls, max_parallel) == expected


def test_segment_rejects_bad_input():
    with pytest.raises(ValueError, match="max_parallel"):
        segment([read(0)], 0)
    with pytest.raises(ValueError, match="twice"):
        segment([read(0), read(0)])


def overlap(a: PurePath, b: PurePath) -> bool:
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)


def conflict(a: PlannedCall, b: PlannedCall) -> bool:
    if a.kind == "read" and b.kind == "read":
        return False
    return any(overlap(p, q) for p in a.paths for q in b.paths)


PATHS = st.sampled_from(["/w/a", "/w/a/x", "/w/a/y", "/w/b", "/w/b/z", "/w/c"])
CALLS = st.lists(
    st.tuples(
        st.sampled_from(["read", "write", "exclusive"]), st.lists(PATHS, max_size=2, unique=True)
    ),
    max_size=20,
)


@settings(max_examples=300, deadline=None)
@given(CALLS, st.integers(1, 5))
def test_segment_properties(raw, max_parallel):
    calls = [
        PlannedCall(i, kind, () if kind == "exclusive" else tuple(Path(p) for p in paths))
        for i, (kind, paths) in enumerate(raw)
    ]
    segments = segment(calls, max_parallel)
    assert [i for seg in segments for i in seg] == list(range(len(calls))), "order kept"
    for seg in segments:
        members = [calls[i] for i in seg]
        assert 1 <= len(seg) <= max_parallel
        if any(c.kind == "exclusive" or (c.kind == "write" and not c.paths) for c in members):
            assert len(seg) == 1
        for x, a in enumerate(members):
            assert not any(conflict(a, b) for b in members[x + 1 :])
    for before, after in itertools.pairwise(segments):
        # A segment ends only for a reason: it is full, or the next call conflicts or runs alone.
        first, previous = calls[after[0]], [calls[i] for i in before]
        assert (
            len(before) == max_parallel
            or any(conflict(first, b) for b in previous)
            or any(
                c.kind == "exclusive" or (c.kind == "write" and not c.paths)
                for c in [first, *previous]
            )
        )


# ---------------------------------------------------------------------------------------------
# run_segments


async def test_reads_run_together_and_an_overlapping_write_waits_for_them():
    log: list[tuple[str, int]] = []
    all_started = asyncio.Event()
    finish = {i: asyncio.Event() for i in range(3)}
    finish[2].set()  # the last read finishes first, then 1, then 0

    async def run_one(index: int) -> str:
        log.append(("start", index))
        if index == 3:
            return "wrote"
        if sum(1 for event, _ in log if event == "start") == 3:
            all_started.set()
        await asyncio.wait_for(all_started.wait(), STEP)  # only possible if all 3 run at once
        await asyncio.wait_for(finish[index].wait(), STEP)
        log.append(("end", index))
        if index > 0:
            finish[index - 1].set()
        return f"read {index}"

    # The reads are path-scoped here, so the write to a path one of them reads must wait.
    calls = [read(0, "/w/a"), read(1, "/w/b"), read(2, "/w/c"), write(3, "/w/a")]
    segments = segment(calls)
    assert segments == [[0, 1, 2], [3]]

    results = await run_segments(segments, run_one, batch_timeout=None)

    assert set(log[:3]) == {("start", 0), ("start", 1), ("start", 2)}
    assert log[3:] == [("end", 2), ("end", 1), ("end", 0), ("start", 3)]
    assert results == ["read 0", "read 1", "read 2", "wrote"]


async def test_results_come_back_in_call_order_whatever_the_segment_order():
    async def run_one(index: int) -> int:
        await asyncio.sleep(0)
        return index * 10

    assert await run_segments([[2, 0], [3], [1]], run_one, None) == [0, 10, 20, 30]
    assert await run_segments([], run_one, None) == []


async def test_a_failing_call_is_that_calls_result():
    boom = RuntimeError("disk full")

    async def run_one(index: int) -> str:
        if index == 1:
            raise boom
        return "ok"

    results = await run_segments([[0, 1, 2], [3]], run_one, None)

    assert results[0] == results[2] == results[3] == "ok"
    assert results[1] == CallFailure(1, "error", boom)
    assert isinstance(results[1], CallFailure)
    assert results[1].describe() == "tool call failed: RuntimeError: disk full"


async def test_run_one_raising_before_it_awaits_is_guarded_too():
    def run_one(index: int) -> asyncio.Future[str]:
        if index == 0:
            raise ValueError("bad arguments")
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        future.set_result("ok")
        return future

    results = await run_segments([[0, 1]], run_one, None)

    assert isinstance(results[0], CallFailure)
    assert results[0].reason == "error"
    assert results[1] == "ok"


async def test_batch_timeout_stops_running_calls_and_skips_later_segments():
    cancelled: list[int] = []
    never = asyncio.Event()

    async def run_one(index: int) -> str:
        if index == 1:
            try:
                await never.wait()
            except asyncio.CancelledError:
                cancelled.append(index)
                raise
        return "ok"

    results = await run_segments([[0, 1], [2]], run_one, batch_timeout=0.05)

    assert results == ["ok", CallFailure(1, "timeout"), CallFailure(2, "not_started")]
    assert cancelled == [1]
    assert all(isinstance(r, str) or r.describe() for r in results)


async def test_a_call_that_cancels_itself_is_reported_as_cancelled():
    async def run_one(index: int) -> str:
        raise asyncio.CancelledError

    assert await run_segments([[0]], run_one, None) == [CallFailure(0, "cancelled")]


async def test_cancelling_the_caller_cancels_the_calls_and_propagates():
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def run_one(index: int) -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "unreachable"

    task = asyncio.create_task(run_segments([[0]], run_one, None))
    await asyncio.wait_for(started.wait(), STEP)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled.is_set()


async def test_run_segments_rejects_a_call_in_two_segments():
    async def run_one(index: int) -> int:
        return index

    with pytest.raises(ValueError, match="twice"):
        await run_segments([[0], [0]], run_one, None)
