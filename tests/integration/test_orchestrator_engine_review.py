"""The wall-clock stop racing a runner that had finished, on real NATS and Postgres (the
sandboxes are a stand-in backend that ends as the test tells it to once the stop reaches it).

The activation was launched by a leader that is gone, its deadline already passed: the new
leader stops its sandbox at once, and how the sandbox ended under the stop, with whether the
runner had recorded its output, decides the end."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from suzumio.contracts.envelope import DomainEvent
from suzumio.contracts.events import (
    ActivationCompleted,
    ActivationOutputRecorded,
    ActivationTimedOut,
)
from suzumio.contracts.subjects import Topology
from suzumio.orchestrator.backends.base import Exit, Handle
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.db.pool import Pool
from tests.integration.test_orchestrator_review_fixes import (
    Sandboxes,
    cleaned_up,
    launched_before,
    leading,
    terminals,
)
from tests.support import eventually

Ended = tuple[list[DomainEvent], list[tuple[str, bool | None]]]
EXITED_BY_ITSELF = Exit(0, "cancelled", "status exited, exit code 0")  # docker, after the stop
JOB_GONE = Exit(None, "lost", "the Job is gone", gone=True)  # kubernetes: deleted by the stop


@pytest.fixture
def ended_under_a_late_stop(
    nc: NATS, topology: Topology, store: EventStore, database_url: str, pool: Pool, tmp_path: Path
) -> Callable[[Exit, str | None], Awaitable[Ended]]:
    async def ended(stopped_as: Exit, output: str | None) -> Ended:
        """How the activation ended, and what its backend was asked; `output`: the text of
        the output its runner recorded, if it did."""
        recorded = [] if output is None else [ActivationOutputRecorded(text=output)]
        _, activation_id = await launched_before(store, "fake", *recorded)
        handle = Handle(activation_id, "fake", "s1", {"deadline": time.time()})  # at its limit
        sandboxes = Sandboxes([handle], stopped_as=stopped_as)
        backends = {"fake": sandboxes}
        async with leading(nc, topology, store, database_url, pool, tmp_path, backends):
            ends = await eventually(
                lambda: terminals(store, activation_id), bool, timeout=30, what="the end"
            )
            calls = await eventually(
                lambda: asyncio.sleep(0, sandboxes.calls[activation_id]),
                cleaned_up,
                what="the cleanup",
            )
        return ends, calls

    return ended


@pytest.mark.parametrize("stopped_as", [EXITED_BY_ITSELF, JOB_GONE], ids=["exited", "job-gone"])
async def test_a_runner_that_finished_as_its_time_ran_out_completes(
    ended_under_a_late_stop: Callable[[Exit, str | None], Awaitable[Ended]], stopped_as: Exit
) -> None:
    """Its output was recorded and it was on its way out when the wall-clock stop reached it:
    docker reports the exit code of a container that exited by itself, a deleted Job none (the
    recorded output then says how its runner exits). Its work is done, as with a cancel that
    came late: a timeout would have the scheduler do it all again."""
    ends, calls = await ended_under_a_late_stop(stopped_as, "the work is done")
    assert [type(e) for e in ends] == [ActivationCompleted], ends
    assert ends[0].text == "the work is done"  # type: ignore[attr-defined]
    assert calls[-1] == ("cleanup", True)


@pytest.mark.parametrize(
    ("stopped_as", "output"),
    [(Exit(None, "cancelled", "killed"), "half"), (EXITED_BY_ITSELF, None), (JOB_GONE, None)],
    ids=["killed-after-its-output", "exited-without-output", "job-gone-without-output"],
)
async def test_a_runner_stopped_at_its_time_limit_before_its_work_was_done_times_out(
    ended_under_a_late_stop: Callable[[Exit, str | None], Awaitable[Ended]],
    stopped_as: Exit,
    output: str | None,
) -> None:
    """The rule above is for work that was done: a runner killed by the stop (whatever it
    recorded), or one that ends without having recorded its output, timed out."""
    ends, calls = await ended_under_a_late_stop(stopped_as, output)
    assert [type(e) for e in ends] == [ActivationTimedOut], ends
    assert calls[-1] == ("cleanup", False)
