"""A pool worker in trouble of its own must not take the pool's work down with it.

A worker whose runs cannot start for a fault of its own (a full disk, cgroups refused, its
runner not starting) failed each in milliseconds and was at once the first free again: it took
most of the pool's queue and failed it, the retries too, while healthy workers sat idle. After
a few such runs in a row it leaves the pool's queue to the others for a while, says why on
/readyz, and has no warm session's dispatch routed to it. And a slow ack keeps no slot."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from suzumio.orchestrator.backends.pool import PoolBackend
from suzumio.runner import worker as worker_module
from tests.integration.test_pool_backend import (  # noqa: F401 - fixtures
    StartWorker,
    Statuses,
    backend,
    fenced_url,
    make_plan,
    statuses,
    wait_workers,
    watch,
    workers,
)
from tests.integration.test_pool_limits import in_process_worker


async def test_a_worker_whose_runs_cannot_start_leaves_the_queue_to_the_others(
    backend: PoolBackend,  # noqa: F811
    workers: StartWorker,  # noqa: F811
    statuses: Statuses,  # noqa: F811
    nats_url: str,
    tmp_path: Path,
    fenced_url: str,  # noqa: F811
) -> None:
    async with in_process_worker(
        nats_url, backend.topology.namespace, tmp_path / "work", worker_id="broken",
        idle_ttl_seconds=30,
    ) as broken:  # fmt: skip
        await wait_workers(backend, "broken")
        assert broken._info(with_exited=False).takes_routed is True

        async def no_space(run: Any) -> Any:
            raise OSError(28, "No space left on device")

        broken._spawn = no_space  # type: ignore[method-assign]
        for _ in range(worker_module.FAULTS_BEFORE_PAUSE):
            handle = await backend.launch(make_plan(fenced_url, tmp_path))
            ended = await watch(backend, handle)
            assert (ended.reason, "No space left" in ended.detail) == ("lost", True)
        assert "3 runs in a row could not start here" in (broken.readiness() or "")
        assert broken._info(with_exited=False).takes_routed is False

        workers("healthy")
        await wait_workers(backend, "healthy")
        handles = [await backend.launch(make_plan(fenced_url, tmp_path)) for _ in range(3)]
        for handle in handles:  # all taken by the healthy worker while the broken one pauses
            assert (await watch(backend, handle)).code == 6
            assert [s.worker_id for s in statuses.of(handle.sandbox_id, "started")] == ["healthy"]


async def test_an_ack_tried_again_holds_no_slot(
    backend: PoolBackend,  # noqa: F811
    statuses: Statuses,  # noqa: F811
    nats_url: str,
    tmp_path: Path,
    fenced_url: str,  # noqa: F811
) -> None:
    """JetStream slow: a run's ack not confirmed at once is tried again. Tried in the run's
    task, the retries held its slot for up to 18 s after its end was told — the orchestrator,
    counting the slot free, routed the session's next dispatch there, to be handed back."""
    async with in_process_worker(
        nats_url, backend.topology.namespace, tmp_path / "work", worker_id="w", concurrency=1
    ) as worker:
        await wait_workers(backend, "w")
        acks: list[str] = []
        retried = asyncio.Event()
        real = worker._ack

        async def slow(msg: Any, dispatch_id: str, timeout: float) -> bool:
            acks.append(dispatch_id)
            if len(acks) == 1:
                return False  # the first: not confirmed in time
            if len(acks) == 2:
                await asyncio.sleep(3)  # its retry, slow too, then confirmed
                done = await real(msg, dispatch_id, timeout)
                retried.set()
                return done
            return await real(msg, dispatch_id, timeout)

        worker._ack = slow  # type: ignore[method-assign]
        first = await backend.launch(make_plan(fenced_url, tmp_path))
        assert (await watch(backend, first)).code == 6
        second = await backend.launch(make_plan(fenced_url, tmp_path))
        assert (await watch(backend, second)).code == 6
        assert not retried.is_set()  # it ran while the first one's ack was still tried
        await asyncio.wait_for(retried.wait(), 10)


async def test_a_sessions_locked_workspace_is_no_fault_of_the_worker(
    backend: PoolBackend,  # noqa: F811
    nats_url: str,
    tmp_path: Path,
    fenced_url: str,  # noqa: F811
) -> None:
    """A run laid out in a warm workspace an agent made read-only (`go build` does) fails
    for that session alone: counted as the worker's fault, three of them paused a healthy
    worker's pulls and failed its /readyz."""
    async with in_process_worker(
        nats_url, backend.topology.namespace, tmp_path / "work", worker_id="w"
    ) as worker:
        await wait_workers(backend, "w")

        def locked(dispatch: Any, msg: Any) -> Any:
            raise PermissionError(13, "Permission denied", "/workspace/out")

        worker._prepare = locked  # type: ignore[method-assign]
        for _ in range(worker_module.FAULTS_BEFORE_PAUSE + 1):
            handle = await backend.launch(make_plan(fenced_url, tmp_path))
            assert (await watch(backend, handle)).reason == "lost"
        assert worker.readiness() is None
        assert worker._fault_pause() == 0


async def test_a_warm_workspace_that_cannot_take_the_run_starts_afresh(
    backend: PoolBackend,  # noqa: F811
    statuses: Statuses,  # noqa: F811
    nats_url: str,
    tmp_path: Path,
    fenced_url: str,  # noqa: F811
) -> None:
    """A session's warm workspace the run could not be laid out in (an agent made it
    read-only) was given back as it was: the session's next activations came back to it,
    and failed the same way, for as long as they kept coming."""
    async with in_process_worker(
        nats_url, backend.topology.namespace, tmp_path / "work", worker_id="w",
        idle_ttl_seconds=30,
    ) as worker:  # fmt: skip
        await wait_workers(backend, "w")
        first = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
        assert (await watch(backend, first)).code == 6
        lay_out: Any = worker._lay_out

        def locked_when_warm(*args: Any, warm_start: bool) -> Any:
            if warm_start:
                raise PermissionError(13, "Permission denied", "out")
            return lay_out(*args, warm_start=warm_start)

        worker._lay_out = locked_when_warm  # type: ignore[method-assign,assignment]
        second = await backend.launch(make_plan(fenced_url, tmp_path, session_id="s1"))
        assert second.data["routed_to"] == "w"
        assert (await watch(backend, second)).code == 6
        [started] = statuses.of(second.sandbox_id, "started")
        assert started.warm is False  # in a fresh workspace
