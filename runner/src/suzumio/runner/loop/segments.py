"""Tool rounds: which calls of one model response may run together, and running them.

Pure planning (`segment`) plus a small executor (`run_segments`); DESIGN.md §9 and
Appendix A. The planner never reorders: it only decides where one segment ends and the next
begins, so a later call never runs before an earlier one that could conflict with it.

Conflicts are decided on `PlannedCall.paths`:

- a write reserves its paths; it joins the current segment only when they overlap none of
  the paths of the other calls already there (overlap = the same path, or one inside the
  other), else it starts a new segment;
- a read joins the current segment unless its paths overlap a path a write there reserved;
  reads never conflict with reads;
- a read names the canonical path it reads (`file.read`'s file or directory, `file.search`'s
  root), so a read of a file a write of the same response writes, or the reverse, starts a
  new segment and runs after it: the read sees the version its position in the response
  implies, never either one by chance;
- a read with no paths (`web.fetch` touches no workspace path; a file read whose path is
  unusable fails without reading) conflicts with nothing, so a write may join it;
- a write with no paths cannot reserve anything, so it is treated as exclusive;
- exclusive calls (`shell.exec`, ask-user, unknown tools, unparseable arguments) run alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Literal, TypeVar

T = TypeVar("T")

CallKind = Literal["read", "write", "exclusive"]
MAX_PARALLEL = 8


@dataclass(frozen=True)
class PlannedCall:
    index: int
    """Position in the model's response (0-based)."""
    kind: CallKind
    paths: tuple[PurePath, ...] = ()
    """Canonical (realpath'd) paths: what a write writes; for a read, what it reads if known."""


def segment(calls: Sequence[PlannedCall], max_parallel: int = MAX_PARALLEL) -> list[list[int]]:
    """Split one response's calls into segments of call indices, in call order."""
    if max_parallel < 1:
        raise ValueError(f"max_parallel must be at least 1, not {max_parallel}")
    _check_unique(call.index for call in calls)
    segments: list[list[int]] = []
    current: list[PlannedCall] = []
    for call in calls:
        if _runs_alone(call):
            if current:
                segments.append([c.index for c in current])
            segments.append([call.index])
            current = []
        elif len(current) >= max_parallel or _conflicts(call, current):
            segments.append([c.index for c in current])
            current = [call]
        else:
            current.append(call)
    if current:
        segments.append([c.index for c in current])
    return segments


def _runs_alone(call: PlannedCall) -> bool:
    return call.kind == "exclusive" or (call.kind == "write" and not call.paths)


def _conflicts(call: PlannedCall, segment_calls: Sequence[PlannedCall]) -> bool:
    for other in segment_calls:
        if call.kind == "read" and other.kind == "read":
            continue
        if any(_overlap(a, b) for a in call.paths for b in other.paths):
            return True
    return False


def _overlap(a: PurePath, b: PurePath) -> bool:
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)


def _check_unique(indices: Iterable[int]) -> None:
    seen: set[int] = set()
    for index in indices:
        if index in seen:
            raise ValueError(f"call index {index} appears twice")
        seen.add(index)


FailureReason = Literal["error", "timeout", "not_started", "cancelled"]


@dataclass(frozen=True)
class CallFailure:
    """The result of a call that produced no result of its own.

    `error`: `run_one` raised (it should return its errors as results; this is the guard).
    `timeout`: the batch time limit ended it while it ran. `not_started`: the batch time limit
    was spent before its segment began. `cancelled`: the call cancelled itself.
    """

    index: int
    reason: FailureReason
    error: BaseException | None = None

    def describe(self) -> str:
        """A one-line text fit for the model's tool result."""
        match self.reason:
            case "error":
                return f"tool call failed: {type(self.error).__name__}: {self.error}"
            case "timeout":
                return "tool call stopped: the tool round's time limit was reached"
            case "not_started":
                return "tool call not run: the tool round's time limit was reached before it"
            case "cancelled":
                return "tool call cancelled"


async def run_segments(
    segments: Sequence[Sequence[int]],
    run_one: Callable[[int], Awaitable[T]],
    batch_timeout: float | None,
    allowances: Mapping[int, float] | None = None,
) -> list[T | CallFailure]:
    """Run segments one after another, each segment's calls concurrently.

    Returns one result per call, ordered by call index (so `results[i]` is call `i` when the
    indices are 0..n-1), whatever order the calls finished in. A call that raised, ran past
    `batch_timeout` (seconds for the whole batch, None = no limit) or never started because
    the time was spent gets a `CallFailure` instead of a result; nothing here raises for one
    call's sake. Cancelling the caller cancels the running calls and waits for them to end
    (`run_one` must honour cancellation) before `CancelledError` propagates.

    `allowances` (seconds, by call index) is the time a call is allowed once it started,
    whatever is left of the batch's: a segment runs for at least its calls' largest
    allowance, so the batch's limit never cuts a call short of a time limit of its own (a
    command's timeout). It only decides whether later segments still start.
    """
    _check_unique(index for seg in segments for index in seg)
    loop = asyncio.get_running_loop()
    deadline = None if batch_timeout is None else loop.time() + batch_timeout
    allowed = allowances or {}
    results: dict[int, T | CallFailure] = {}
    for seg in segments:
        remaining = None if deadline is None else deadline - loop.time()
        if remaining is not None and remaining <= 0:
            results.update({i: CallFailure(i, "not_started") for i in seg})
            continue
        if remaining is not None:
            remaining = max([remaining, *(allowed.get(i, 0.0) for i in seg)])
        results.update(await _run_segment(seg, run_one, remaining))
    return [results[i] for i in sorted(results)]


async def _run_segment(
    seg: Sequence[int], run_one: Callable[[int], Awaitable[T]], timeout: float | None
) -> dict[int, T | CallFailure]:
    async def call(index: int) -> T:
        return await run_one(index)  # inside the task, so a synchronous raise is its error too

    tasks = {i: asyncio.ensure_future(call(i)) for i in seg}
    if not tasks:
        return {}
    try:
        _, pending = await asyncio.wait(tasks.values(), timeout=timeout)
    except BaseException:
        await _cancel_and_wait(tasks.values())
        raise
    await _cancel_and_wait(pending)
    outcomes: dict[int, T | CallFailure] = {}
    for i, task in tasks.items():
        outcome = _outcome(i, task, timed_out=task in pending)
        outcomes[i] = outcome
    return outcomes


async def _cancel_and_wait(tasks: Iterable[asyncio.Future[T]]) -> None:
    pending = [t for t in tasks if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)


def _outcome(index: int, task: asyncio.Future[T], *, timed_out: bool) -> T | CallFailure:
    if task.cancelled():
        return CallFailure(index, "timeout" if timed_out else "cancelled")
    error = task.exception()
    if error is not None:
        return CallFailure(index, "error", error)
    return task.result()
