"""Session affinity of the pool backend, with real workers on real NATS: a warm session's next
dispatches go to the worker that keeps it warm (its own consumer), not to whichever worker
pulls first — unless that worker is full or gone.

The runners really run; the broker answers 401 (the runner is fenced: exit 6 at once) or never
answers (the runner hangs until it is stopped).
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from suzumio.contracts.runner import PoolCancel, PoolWorkerInfo
from suzumio.contracts.subjects import Topology
from suzumio.orchestrator.backends.base import Handle
from suzumio.orchestrator.backends.pool import PoolBackend
from tests.integration import test_pool_backend as pool_tests
from tests.integration.test_pool_backend import (
    Hanging,
    StartWorker,
    Statuses,
    eventually,
    make_plan,
    queue_is_empty,
    wait_workers,
    watch,
)

# The pool backend tests' fixtures: workers started and stopped, statuses heard, brokers.
backend, workers, statuses = pool_tests.backend, pool_tests.workers, pool_tests.statuses
fenced_url, hanging = pool_tests.fenced_url, pool_tests.hanging


def ran_on(statuses: Statuses, handle: Handle) -> list[str]:
    return [s.worker_id for s in statuses.of(handle.sandbox_id, "started")]


async def test_a_warm_sessions_next_dispatches_go_to_the_worker_keeping_it(
    backend: PoolBackend, workers: StartWorker, statuses: Statuses, nc: NATS,
    topology: Topology, tmp_path: Path, fenced_url: str,
) -> None:  # fmt: skip
    """Two idle workers pull the pool's queue by turns; a session's activations after its
    first all run on the first one's worker, warm, on its resident runner."""
    workers("wa", "--take-routed", concurrency=2, idle_ttl=30)
    workers("wb", "--take-routed", concurrency=2, idle_ttl=30)
    await wait_workers(backend, "wa", "wb")

    first = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
    assert first.data["routed_to"] is None  # nobody keeps it warm yet: the pool's queue
    assert (await watch(backend, first)).code == 6
    [home] = ran_on(statuses, first)

    for _ in range(6):
        handle = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
        assert handle.data["routed_to"] == home
        assert (await watch(backend, handle)).code == 6
        [started] = statuses.of(handle.sandbox_id, "started")
        assert (started.worker_id, started.warm, started.resident) == (home, True, True)
    # An orchestrator that takes over learns from the workers' beats where sessions are warm.
    successor = PoolBackend(nc, topology, pool_tests.SETTINGS)
    try:
        await wait_workers(successor, "wa", "wb")
        await eventually(lambda: "s1" in successor._warm)
        handle = await successor.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
        assert handle.data["routed_to"] == home
        assert (await watch(successor, handle)).code == 6
        assert ran_on(statuses, handle) == [home]
    finally:
        await successor.close()
    # Other sessions still spread over both workers.
    others = [
        await backend.launch(make_plan(fenced_url, tmp_path, session_id=f"o{i}")) for i in range(6)
    ]
    await asyncio.gather(*(watch(backend, h) for h in others))
    assert {w for h in others for w in ran_on(statuses, h)} == {"wa", "wb"}
    await eventually(lambda: queue_is_empty(nc, topology), timeout=5)


async def test_a_warm_session_goes_to_the_pools_queue_while_its_worker_is_full(
    backend: PoolBackend, workers: StartWorker, statuses: Statuses, tmp_path: Path,
    fenced_url: str, hanging: tuple[str, Hanging],
) -> None:  # fmt: skip
    workers("wa", "--take-routed", concurrency=1, idle_ttl=30)
    workers("wb", "--take-routed", concurrency=1, idle_ttl=30)
    await wait_workers(backend, "wa", "wb")
    first = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
    await watch(backend, first)
    [home] = ran_on(statuses, first)
    other = "wb" if home == "wa" else "wa"

    # The warm worker's one slot taken by another session's run (routed there too, as warm).
    url, broker = hanging
    busy = await backend.launch(make_plan(url, tmp_path, session_id="s1"))
    await eventually(lambda: broker.open > 0)
    assert ran_on(statuses, busy) == [home]

    handle = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
    assert handle.data["routed_to"] is None
    assert (await watch(backend, handle)).code == 6
    assert ran_on(statuses, handle) == [other]
    await backend.cancel(busy)
    await watch(backend, busy, timeout=15)


async def test_a_dispatch_sent_to_a_worker_that_died_is_lost_and_the_next_goes_elsewhere(
    backend: PoolBackend, workers: StartWorker, statuses: Statuses, nc: NATS,
    topology: Topology, tmp_path: Path, fenced_url: str,
) -> None:  # fmt: skip
    """Only the worker a dispatch was sent to would take it: once that worker is gone, the
    attempt ends as lost (retryable, as a run whose worker died) and its message leaves the
    stream; the session's next dispatch goes to the pool's queue."""
    wa = workers("wa", "--take-routed", idle_ttl=30)
    await wait_workers(backend, "wa")
    first = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
    await watch(backend, first)
    assert ran_on(statuses, first) == ["wa"]
    workers("wb", "--take-routed", idle_ttl=30)
    await wait_workers(backend, "wa", "wb")

    wa.send_signal(signal.SIGKILL)
    wa.wait()
    stranded = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
    assert stranded.data["routed_to"] == "wa"  # its beats were still fresh

    result = await watch(backend, stranded, timeout=30)
    assert (result.reason, result.gone) == ("lost", True)
    assert "wa" in result.detail
    assert ran_on(statuses, stranded) == []
    await eventually(lambda: queue_is_empty(nc, topology), timeout=5)

    after = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
    assert after.data["routed_to"] is None
    assert (await watch(backend, after)).code == 6
    assert ran_on(statuses, after) == ["wb"]


async def test_a_dispatch_sent_to_a_worker_as_it_stops_is_handed_back_and_runs_elsewhere(
    backend: PoolBackend, workers: StartWorker, statuses: Statuses, tmp_path: Path,
    fenced_url: str, hanging: tuple[str, Hanging], monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A stopping worker left its own consumer at once, but said so only at its next beat:
    what an orchestrator routed to it meanwhile waited there, pulled by nobody, until the
    worker was gone (its drain, then `worker_alive_seconds`), and was lost — on every
    rolling restart. It now says so at once and, while it drains, hands back what still
    comes, which the orchestrator queues for any worker."""
    wa = workers("wa", "--take-routed", "--drain", "8", concurrency=2, idle_ttl=30)
    await wait_workers(backend, "wa")
    first = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
    assert (await watch(backend, first)).code == 6
    url, broker = hanging
    busy = await backend.launch(make_plan(url, tmp_path, session_id="s2"))  # the drain waits
    await eventually(lambda: broker.open > 0)

    wa.send_signal(signal.SIGTERM)
    await eventually(lambda: not backend._workers["wa"][1].takes_routed, timeout=5)
    await asyncio.sleep(1.5)  # past the fetch its own consumer had open when it was told
    # An orchestrator that had not heard yet (its view as it was before the stop).
    monkeypatch.setattr(backend, "_warm_worker", lambda key, pool: "wa")
    late = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
    assert late.data["routed_to"] == "wa"
    monkeypatch.undo()
    workers("wb", "--take-routed", idle_ttl=30)
    result = await watch(backend, late, timeout=30)
    assert (result.code, ran_on(statuses, late)) == (6, ["wb"])
    await backend.cancel(busy)
    await watch(backend, busy, timeout=15)


async def test_a_worker_runs_no_more_than_its_concurrency_with_dispatches_on_both_queues(
    backend: PoolBackend, workers: StartWorker, statuses: Statuses, tmp_path: Path,
    fenced_url: str, hanging: tuple[str, Hanging],
) -> None:  # fmt: skip
    """An idle worker waits on both its queues at once, so a dispatch on each may come for its
    one slot: the second is held until the first ended, never run beside it."""
    workers("wa", "--take-routed", idle_ttl=30)
    await wait_workers(backend, "wa")
    warm = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
    await watch(backend, warm)

    url, broker = hanging
    hung_plan = make_plan(url, tmp_path, session_id="s2")
    routed_plan = make_plan(fenced_url, tmp_path, session_id="s1")
    hung, routed = await asyncio.gather(backend.launch(hung_plan), backend.launch(routed_plan))
    assert (hung.data["routed_to"], routed.data["routed_to"]) == (None, "wa")

    await eventually(lambda: ran_on(statuses, hung) or ran_on(statuses, routed))
    ids = {hung.sandbox_id, routed.sandbox_id}
    first = next(s.dispatch_id for s in statuses.seen if s.dispatch_id in ids)
    if first == hung.sandbox_id:  # the hung one took the slot: the other waits for it
        await eventually(lambda: broker.open > 0)
        await asyncio.sleep(1.0)  # time enough to have started it, were it not held
        assert ran_on(statuses, routed) == []
        await backend.cancel(hung)
        assert (await watch(backend, hung, timeout=15)).reason == "killed"
        assert (await watch(backend, routed)).code == 6
    else:  # the other way round: the routed one ends (fenced) before the hung one starts
        assert (await watch(backend, routed)).code == 6
        await eventually(lambda: ran_on(statuses, hung))
        await backend.cancel(hung)
        await watch(backend, hung, timeout=15)
    order = [
        (s.kind, s.dispatch_id)
        for s in statuses.seen
        if s.dispatch_id in {hung.sandbox_id, routed.sandbox_id} and s.kind in {"started", "exited"}
    ]
    assert len(order) == 4
    assert order[0][0] == "started", order
    assert order[1] == ("exited", order[0][1]), order


@pytest.mark.parametrize(
    ("options", "idle_ttl", "takes_routed"),
    [((), 30, True), (("--no-take-routed",), 30, False), ((), 0, False)],
    ids=["warm-sessions", "opted-out", "no-warm-sessions"],
)
async def test_a_workers_first_beat_says_whether_it_takes_routed_dispatches(
    workers: StartWorker, nc: NATS, topology: Topology,
    options: tuple[str, ...], idle_ttl: float, takes_routed: bool,
) -> None:  # fmt: skip
    """A worker keeping sessions warm takes the dispatches routed to it unless told not to; one
    without warm sessions has none routed to it and no consumer for them. Its own consumer is
    bound before it first says it is there: an orchestrator routes a warm session's next
    dispatch to it from then on, not only from its second beat."""
    beats: asyncio.Queue[PoolWorkerInfo] = asyncio.Queue()

    async def on_beat(msg: Msg) -> None:
        await beats.put(PoolWorkerInfo.model_validate_json(msg.data))

    sub = await nc.subscribe(topology.pool_worker_subject("wa"), cb=on_beat)
    try:
        workers("wa", *options, concurrency=2, idle_ttl=idle_ttl)
        first = await asyncio.wait_for(beats.get(), 60)
    finally:
        await sub.unsubscribe()
    assert first.takes_routed is takes_routed


async def test_a_pool_dispatch_whose_slot_a_routed_one_took_waits_for_the_next(
    backend: PoolBackend, workers: StartWorker, tmp_path: Path, fenced_url: str
) -> None:
    """A dispatch on each queue for a worker's one free slot: when the routed one gets it, the
    pool's waits for the slot it frees, not sent back at once — a nak counts as a delivery, and
    one sent back at each slot freed on a busy worker was at its `max_deliver` in moments. (The
    worker takes the two in either order; over the rounds the routed one comes first too.)"""
    workers("wa", "--take-routed", idle_ttl=30)
    await wait_workers(backend, "wa")
    warm = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
    await watch(backend, warm)
    for i in range(6):
        pooled, routed = await asyncio.gather(
            backend.launch(make_plan(fenced_url, tmp_path, session_id=f"p{i}")),
            backend.launch(make_plan(fenced_url, tmp_path, session_id="s1")),
        )
        assert (pooled.data["routed_to"], routed.data["routed_to"]) == (None, "wa")
        ends = await asyncio.gather(watch(backend, pooled), watch(backend, routed))
        assert [end.code for end in ends] == [6, 6]
    log = (tmp_path / "wa.log").read_text()
    assert "worker.no_slot_left" not in log
    assert "worker.redelivered" not in log


async def test_a_dispatch_sent_to_a_worker_full_with_runs_unheard_of_runs_elsewhere(
    backend: PoolBackend, workers: StartWorker, statuses: Statuses, nc: NATS,
    topology: Topology, tmp_path: Path, fenced_url: str, hanging: tuple[str, Hanging],
) -> None:  # fmt: skip
    """The orchestrator routes by the runs it knows of: a warm worker whose one slot holds a run
    it has not heard of (here sent by another backend; in life taken from the pool's queue,
    its `started` not in yet) is sent the warm session's next dispatch. The worker hands it
    back after a while and it runs on another worker — it does not wait for the run holding
    the slot to end, which may outlast its deadline."""
    workers("wa", "--take-routed", idle_ttl=30)
    await wait_workers(backend, "wa")
    first = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
    assert (await watch(backend, first)).code == 6

    url, broker = hanging
    other = PoolBackend(nc, topology, pool_tests.SETTINGS)
    held = await other.launch(make_plan(url, tmp_path, session_id="s2"))
    try:
        await eventually(lambda: broker.open > 0)
        assert ran_on(statuses, held) == ["wa"]
        workers("wb")
        await wait_workers(backend, "wb")

        handle = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
        assert handle.data["routed_to"] == "wa"
        assert (await watch(backend, handle, timeout=30)).code == 6
        assert ran_on(statuses, handle) == ["wb"]
        [refused] = statuses.of(handle.sandbox_id, "refused")
        assert (refused.worker_id, refused.reason) == ("wa", "busy")
        assert handle.data["routed_to"] is None
        assert ran_on(statuses, held) == ["wa"]  # still running there, untouched
    finally:
        await other.cancel(held)
        await watch(other, held, timeout=15)
        await other.close()
    await eventually(lambda: queue_is_empty(nc, topology), timeout=5)


async def warm_on_full_worker(
    backend: PoolBackend, workers: StartWorker, tmp_path: Path, fenced_url: str,
    hanging: tuple[str, Hanging],
) -> Handle:  # fmt: skip
    """Worker wa (one slot) keeps session s1 warm, and its slot is held by a run of s2 that
    `backend` has not heard of (in life: taken from the pool's queue, its `started` not in
    yet): s1's next dispatch is routed to wa, full. Returns the held run."""
    workers("wa", "--take-routed", idle_ttl=30)
    await wait_workers(backend, "wa")
    first = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
    assert (await watch(backend, first)).code == 6
    url, broker = hanging
    held = await backend.launch(make_plan(url, tmp_path, session_id="s2"))
    await eventually(lambda: broker.open > 0)
    backend._trackers.pop(held.sandbox_id)  # a run it has not heard of
    return held


async def test_a_handed_back_dispatch_an_orchestrator_did_not_send_is_lost(
    backend: PoolBackend, workers: StartWorker, statuses: Statuses, nc: NATS,
    topology: Topology, tmp_path: Path, fenced_url: str, hanging: tuple[str, Hanging],
) -> None:  # fmt: skip
    """An orchestrator that took over watches a routed dispatch it has not the body of: handed
    back by its full worker, the attempt ends as lost (retryable) and nothing runs it — not
    left queued on the worker until its deadline."""
    held = await warm_on_full_worker(backend, workers, tmp_path, fenced_url, hanging)
    successor = PoolBackend(nc, topology, pool_tests.SETTINGS)
    try:
        await wait_workers(successor, "wa")
        handle = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
        assert handle.data["routed_to"] == "wa"
        result = await watch(successor, handle, timeout=30)
        assert (result.reason, result.code) == ("lost", None)
        assert "no slot" in result.detail
        assert ran_on(statuses, handle) == []
    finally:
        await successor.close()
    await backend.cancel(held)
    await eventually(lambda: statuses.of(held.sandbox_id, "exited"))


class LosingRequeues(PoolBackend):
    """Its requeue's answers are lost (the copy queued all the same, as when only the answer
    went missing)."""

    async def _queue(self, subject: str, did: str, body: bytes) -> dict[str, Any]:
        if did.endswith(".pool"):
            await super()._queue(subject, did, body)
            raise TimeoutError
        return await super()._queue(subject, did, body)


async def test_a_handed_back_dispatch_whose_requeue_is_unconfirmed_is_withdrawn(
    workers: StartWorker, statuses: Statuses, nc: NATS, topology: Topology,
    tmp_path: Path, fenced_url: str, hanging: tuple[str, Hanging],
) -> None:  # fmt: skip
    """The copy sent to the pool's queue may be there though its answer was lost: the attempt
    ends lost (retryable) and the copy is cancelled on the workers — never run beside the
    retry."""
    backend = LosingRequeues(nc, topology, pool_tests.SETTINGS)
    cancels: list[str] = []

    async def on_cancel(msg: Msg) -> None:
        cancels.append(PoolCancel.model_validate_json(msg.data).dispatch_id or "")

    sub = await nc.subscribe(topology.pool_cancel_subject("*"), cb=on_cancel)
    try:
        held = await warm_on_full_worker(backend, workers, tmp_path, fenced_url, hanging)
        handle = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
        assert handle.data["routed_to"] == "wa"
        result = await watch(backend, handle, timeout=30)
        assert result.reason == "lost", result
        await eventually(lambda: handle.sandbox_id in cancels)
        await backend.cancel(held)
        await eventually(lambda: statuses.of(held.sandbox_id, "exited"))
        assert ran_on(statuses, handle) == []
    finally:
        await sub.unsubscribe()
        await backend.close()
