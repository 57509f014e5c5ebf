"""Crash windows of the pool (review): a worker killed after it reported a run's end (its ack
not confirmed) before the ack reached the queue. The orchestrator has the end and ends the
activation; the dispatch is still in the work queue, unacked, and the queue hands it out again
once the ack wait passed.
No worker may start that attempt again (its runner would call the model, paid, before the
broker fences it)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import psutil
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from suzumio.contracts.runner import PoolStatus
from suzumio.contracts.subjects import Topology
from suzumio.contracts.values import Backend, RuntimeProfileSpec
from suzumio.orchestrator.backends import process
from suzumio.orchestrator.backends.pool import PoolBackend
from suzumio.orchestrator.backends.process import ProcessBackend, ProcessSettings
from tests.integration.test_pool_backend import (  # noqa: F401 - fixtures
    StartWorker,
    Statuses,
    backend,
    fenced_url,
    handed_out_once,
    make_plan,
    statuses,
    wait_workers,
    watch,
    workers,
)


async def test_a_dispatch_whose_worker_died_before_its_ack_is_not_run_again_after_its_end(
    backend: PoolBackend,  # noqa: F811
    workers: StartWorker,  # noqa: F811
    statuses: Statuses,  # noqa: F811
    nc: NATS,
    topology: Topology,
    tmp_path: Path,
    fenced_url: str,  # noqa: F811
) -> None:
    handle = await backend.launch(make_plan(fenced_url, tmp_path))
    did = handle.sandbox_id
    # The worker that takes it: this test, which runs nothing — it reports the run's start
    # and end as a worker whose ack was not confirmed does (`Worker._report_end`: `acked`
    # false), and is killed right after the status went out, so the ack never comes.
    js = nc.jetstream()
    psub = await js.pull_subscribe_bind(
        topology.pool_consumer("default"), stream=topology.activations_stream
    )
    [msg] = await psub.fetch(1, timeout=5)
    for kind, extra in (("started", {}), ("exited", {"reason": "exited", "exit_code": 0})):
        status = PoolStatus(
            kind=kind,  # type: ignore[arg-type]
            dispatch_id=did,
            activation_id=handle.activation_id,
            attempt=1,
            worker_id="dead",
            pool="default",
            at=datetime.now(UTC),
            **extra,  # type: ignore[arg-type]
        )
        await nc.publish(
            topology.pool_status_subject(handle.activation_id), status.model_dump_json().encode()
        )
    exit_ = await watch(backend, handle)
    assert exit_.code == 0
    await backend.cleanup(handle, succeeded=True)  # as the engine does once the end is logged
    del msg  # never acked: its worker is dead

    workers("wb")
    await wait_workers(backend, "wb")
    # Left in the queue, the unacked dispatch would go to wb once its ack wait passed; taken
    # out, it was handed out once (to the dead worker) and never can be again.
    await handed_out_once(nc, topology)
    started_by = [s.worker_id for s in statuses.of(did, "started")]
    assert started_by == ["dead"], f"the ended attempt ran again on {started_by[1:]}"
    await psub.unsubscribe()


# -- the process backend: a runner started, then the orchestrator killed before its record ------
class Killed(BaseException):
    """The orchestrator's process killed at this point (nothing after it runs)."""


async def test_a_runner_whose_launcher_died_right_after_starting_it_is_found_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ProcessBackend.launch` starts the runner, then writes `process.json`, which is all a
    restarted orchestrator finds it by. Killed in between, the runner runs on unrecorded: the
    next leader's `list_live` does not list it, so `_recover` (started never appended, nothing
    logged yet) launches the activation a second time beside it, and nobody ever stops it."""
    fake_python = tmp_path / "python"
    fake_python.write_text("#!/bin/sh\nexec sleep 30\n")  # a runner that takes its time
    fake_python.chmod(0o755)
    root = tmp_path / "sandboxes"
    settings = ProcessSettings(python=str(fake_python), isolate=False)
    plan = make_plan("http://127.0.0.1:9", root / "activations")
    plan = replace(plan, profile=RuntimeProfileSpec(backend=Backend.PROCESS))

    def killed_here(pid: int) -> int | None:
        raise Killed

    monkeypatch.setattr(process, "_start_time", killed_here)
    with pytest.raises(Killed):
        await ProcessBackend(root, settings).launch(plan)
    monkeypatch.undo()

    running = [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(plan.host_dir) in " ".join(p.info["cmdline"] or [])
    ]
    try:
        assert running, "the runner should be running"
        listed = await ProcessBackend(root, settings).list_live()  # the next leader's view
        assert [h.activation_id for h in listed] == [plan.activation_id], (
            "a running runner the restarted orchestrator cannot see"
        )
    finally:
        for proc in running:
            with contextlib.suppress(psutil.Error):
                os.killpg(proc.pid, signal.SIGKILL)


async def test_cleanup_of_a_dispatch_acked_while_an_earlier_one_runs_cancels_nothing(
    backend: PoolBackend,  # noqa: F811
    nc: NATS,
    topology: Topology,
    tmp_path: Path,
    fenced_url: str,  # noqa: F811
) -> None:
    """The usual end under load: the worker acked the dispatch while an earlier one still runs
    unacked, so its sequence is a deleted one inside the stream's store — the server says
    "sequence not found" (10043), not "no message found" (10057). It was taken for an unknown
    answer: every such activation's cleanup logged a warning and broadcast a cancel to every
    worker."""
    handles = [
        await backend.launch(make_plan(fenced_url, tmp_path / str(i), session_id=f"s{i}"))
        for i in range(2)
    ]
    js = nc.jetstream()
    psub = await js.pull_subscribe_bind(
        topology.pool_consumer("default"), stream=topology.activations_stream
    )
    first, second = await psub.fetch(2, timeout=5)
    await second.ack_sync()  # as its worker does once it reported the end; the first runs on
    cancels: list[str] = []

    async def on_cancel(msg: Msg) -> None:
        cancels.append(msg.subject)

    sub = await nc.subscribe(topology.pool_cancel_subject("*"), cb=on_cancel)
    await backend.cleanup(handles[1], succeeded=True)
    await nc.flush()
    await asyncio.sleep(0.3)  # a broadcast, had there been one, has arrived
    await sub.unsubscribe()
    await first.ack_sync()
    await psub.unsubscribe()
    assert cancels == [], "an acked dispatch's cleanup cancelled it on every worker"
