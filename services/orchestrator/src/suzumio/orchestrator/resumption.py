"""What a leader that takes over needs to pick up activations another one launched
(DESIGN.md §8, reconciliation): the sandboxes each backend still has (and which backends could
not say), the end of an activation whose sandbox is gone, and the deadline of one whose plan
is gone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from datetime import datetime

from suzumio.contracts.events import ActivationOutputRecorded
from suzumio.orchestrator.backends.base import Backend, Exit, Handle
from suzumio.platform.bus.eventstore import AggregateStream
from suzumio.platform.logging import get_logger

log = get_logger(__name__)
# A backend that cannot list its sandboxes (its engine or API unreachable while a replica
# takes the lead) is asked again after these waits, doubling, for as long as the replica leads.
RELIST_FIRST_SECONDS = 1.0
RELIST_MAX_SECONDS = 60.0
# A listing that hangs (a half-open connection) counts as failed, to be asked again.
LIST_TIMEOUT_SECONDS = 60.0
# The exit code a runner makes after its output was recorded with this reason (runner/exits.py).
EXIT_AFTER_OUTPUT = {"completed": 0, "waiting": 3, "budget_exhausted": 4, "failed": 5}
GONE = "its sandbox was gone when the orchestrator came back"


async def list_live(
    backends: Mapping[str, Backend], names: Iterable[str]
) -> tuple[dict[str, Handle], set[str]]:
    """The sandboxes the backends `names` still have, by activation; the backends that could
    not say (nothing about their activations may be concluded from their silence)."""
    live: dict[str, Handle] = {}
    unlisted: set[str] = set()
    for name in names:
        try:
            found = await asyncio.wait_for(backends[name].list_live(), LIST_TIMEOUT_SECONDS)
        except Exception as exc:
            log.warning("orchestrator.list_live_failed", backend=name, error=repr(exc))
            unlisted.add(name)
            continue
        live.update((handle.activation_id, handle) for handle in found)
    return live, unlisted


def exit_of_gone(stream: AggregateStream) -> Exit:
    """How an activation whose sandbox is gone ended, as far as the log tells: if its output
    was recorded, the runner had finished and exits as it does after such an output (a
    Kubernetes Job removed by its TTL while no orchestrator watched); else it is lost."""
    output = next(
        (e.data for e in stream.events if isinstance(e.data, ActivationOutputRecorded)), None
    )
    if output is None:
        return Exit(None, "lost", GONE)
    return exit_after_output(output, f"{GONE}; its output was recorded")


def exit_after_output(output: ActivationOutputRecorded, detail: str) -> Exit:
    """The exit of a runner that recorded `output`, for one whose exit code is lost."""
    return Exit(EXIT_AFTER_OUTPUT[output.reason], "exited", detail)


def deadline_of(
    started_at: datetime | None, wall_clock_seconds: float | None, found_at: float
) -> float | None:
    """The wall-clock deadline (epoch seconds) of an activation found again after a restart:
    its limit counted from its start in the log. A launch counts it from its plan, moments
    earlier, so this is at most that moment more lenient. One launched whose start was never
    appended (its leader crashed in between) has it counted from `found_at`: later than it
    should be, never unbounded."""
    if wall_clock_seconds is None:
        return None
    return (started_at.timestamp() if started_at else found_at) + wall_clock_seconds
