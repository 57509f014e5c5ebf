"""A pool worker's answers to reviews (real NATS, a worker in this process whose runner is a
stand-in script): a run whose end it has told and acked is listed as exited, not as running,
even while its task is still letting go of it (`pool.list`: the orchestrator's reconciliation
and its backend's `list_live`); a warm session's files it could not store are not handed in as
the next activation's output; a cancel while a dispatch's files come in starts no runner; what
workers killed outright left under the work directory is swept."""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.object_store import ObjectStore

from suzumio.contracts.runner import FileRef, PoolStatus
from suzumio.contracts.subjects import ARTIFACTS_BUCKET, blob_name
from suzumio.contracts.values import Timeouts
from suzumio.orchestrator.backends.pool import PoolBackend
from suzumio.platform.bus.kv import ensure_object_store
from suzumio.runner import worker as worker_module
from tests.integration.test_pool_backend import (  # noqa: F401 - fixtures
    backend,
    make_plan,
    wait_workers,
    watch,
)
from tests.integration.test_pool_limits import in_process_worker, with_profile
from tests.support import eventually


@pytest.fixture
def quick_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-process worker's cold runners exit 3 at once."""
    script = tmp_path / "bin" / "python"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\nexit 3\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(script))


async def test_a_run_whose_end_was_told_is_listed_as_exited_not_running(
    backend: PoolBackend,  # noqa: F811
    nats_url: str,
    tmp_path: Path,
    quick_runner: None,
) -> None:
    async with in_process_worker(
        nats_url, backend.topology.namespace, tmp_path / "work", worker_id="listing"
    ) as worker:
        await wait_workers(backend, "listing")
        told = asyncio.Event()
        let_go = asyncio.Event()
        report_end = worker._report_end

        async def held_after_the_report(msg: Msg, status: PoolStatus) -> None:
            await report_end(msg, status)  # told and acked; the run is not yet let go
            told.set()
            await let_go.wait()

        worker._report_end = held_after_the_report  # type: ignore[method-assign]
        handle = await backend.launch(make_plan("http://127.0.0.1:9", tmp_path / "plans"))
        end = await watch(backend, handle, timeout=60)
        assert end.code == 3, end
        await asyncio.wait_for(told.wait(), 15)
        assert handle.sandbox_id in worker._runs  # the window this test is about
        try:
            listed = {h.sandbox_id: h for h in await backend.list_live()}
            assert listed[handle.sandbox_id].data["state"] == "exited"
            assert listed[handle.sandbox_id].ended
        finally:
            let_go.set()


async def test_an_end_whose_ack_is_not_confirmed_goes_out_before_the_acks_retries(
    backend: PoolBackend,  # noqa: F811
    nats_url: str,
    nc: NATS,
    tmp_path: Path,
    quick_runner: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """JetStream confirms no ack (slow, or electing a leader) while core NATS carries the
    rest: the run's end goes out after the first try, saying the ack was not confirmed — not
    behind every retry, past the orchestrator's heartbeat timeout, where a worker dying
    meanwhile would leave its attempt lost rather than ended as it did. The orchestrator then
    takes the dispatch out of the queue itself."""
    tries: list[float] = []
    ends: list[tuple[PoolStatus, int]] = []  # each `exited`, with the tries made when it came

    async def unconfirmed(self: Msg, timeout: float = 1.0) -> None:  # noqa: ARG001
        tries.append(timeout)
        await asyncio.sleep(0.01)
        raise NatsTimeoutError

    async def on_status(msg: Msg) -> None:
        status = PoolStatus.model_validate_json(msg.data)
        if status.kind == "exited":
            ends.append((status, len(tries)))

    monkeypatch.setattr(Msg, "ack_sync", unconfirmed)
    monkeypatch.setattr(worker_module, "ACK_SECONDS", 0.01)
    sub = await nc.subscribe(backend.topology.pool_status_subject("*"), cb=on_status)
    async with in_process_worker(
        nats_url, backend.topology.namespace, tmp_path / "work", worker_id="slowacks"
    ):
        await wait_workers(backend, "slowacks")
        handle = await backend.launch(make_plan("http://127.0.0.1:9", tmp_path / "plans"))
        end = await watch(backend, handle, timeout=60)
        await backend.cleanup(handle, succeeded=False)
        retried = 1 + worker_module.ACK_RETRIES
        await eventually(lambda: asyncio.sleep(0, len(tries)), lambda n: n == retried)
    await sub.unsubscribe()

    assert end.code == 3, end
    [(status, tried)] = ends
    assert (status.acked, tried) == (False, 1)
    # Never acked: taken out by the orchestrator, so no worker is handed it again.
    stream = await nc.jetstream().stream_info(backend.topology.activations_stream)
    assert stream.state.messages == 0


async def test_a_warm_sessions_outputs_not_stored_are_not_the_next_activations(
    backend: PoolBackend,  # noqa: F811
    nats_url: str,
    nc: NATS,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The store could not be reached when the first activation's `out/` was to be stored:
    its files stayed in the warm workspace, and the session's next activation reported them
    as its own output."""
    await ensure_object_store(nc.jetstream(), backend.topology.bucket(ARTIFACTS_BUCKET))
    marker = tmp_path / "ran"
    script = tmp_path / "bin" / "python"
    script.parent.mkdir()
    script.write_text(  # the first run leaves a file in out/; the later ones nothing
        f'#!/bin/sh\n[ -e {marker} ] && exit 0\ntouch {marker}\necho x > "$HOME/out/left.txt"\n'
    )
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(script))
    warm = Timeouts(idle_seconds=600)
    plans = [
        replace(
            with_profile(make_plan("x", tmp_path / "plans"), timeouts=warm),
            max_output_files=10,
            max_output_bytes=1000,
        )
        for _ in range(2)
    ]
    async with in_process_worker(
        nats_url, backend.topology.namespace, tmp_path / "work", worker_id="outs",
        idle_ttl_seconds=600.0,
    ) as worker:  # fmt: skip
        await wait_workers(backend, "outs")
        objects = worker._objects

        async def unreachable() -> ObjectStore:
            raise NatsTimeoutError

        worker._objects = unreachable  # type: ignore[method-assign]
        first = await watch(backend, await backend.launch(plans[0]), timeout=60)
        worker._objects = objects  # type: ignore[method-assign]
        second = await watch(backend, await backend.launch(plans[1]), timeout=60)
    assert marker.exists()
    assert len(worker.warm) == 1  # the session was kept warm: its workspace handed on
    assert (first.code, first.outputs) == (0, ())
    assert (second.code, second.outputs) == (0, ())


async def test_a_cancel_while_its_files_come_in_starts_no_runner(
    backend: PoolBackend,  # noqa: F811
    nats_url: str,
    nc: NATS,
    tmp_path: Path,
    quick_runner: None,
) -> None:
    """Cancelled while the worker brought its files in: the runner was still started (the
    input, token included, handed to it), told `started`, then killed."""
    store = await ensure_object_store(nc.jetstream(), backend.topology.bucket(ARTIFACTS_BUCKET))
    data = b"x" * 1_000
    digest = hashlib.sha256(data).hexdigest()
    await store.put(blob_name(digest), data)
    inputs = tuple(FileRef(path=f"f{i}.txt", sha256=digest, size=len(data)) for i in range(500))
    plan = replace(make_plan("http://127.0.0.1:9", tmp_path / "plans"), inputs=inputs)
    seen: list[str] = []
    async with in_process_worker(
        nats_url, backend.topology.namespace, tmp_path / "work", worker_id="early"
    ) as worker:
        await wait_workers(backend, "early")
        bring_in = worker._bring_in

        async def cancelled_meanwhile(run: Any) -> None:
            await backend.cancel(handle)
            await eventually(
                lambda: asyncio.sleep(0, run.stop_reason), lambda r: r is not None, timeout=10
            )
            await bring_in(run)

        worker._bring_in = cancelled_meanwhile  # type: ignore[method-assign]
        publish = worker._publish

        async def recording(status: PoolStatus, *, flush: bool = False) -> None:
            seen.append(status.kind)
            await publish(status, flush=flush)

        worker._publish = recording  # type: ignore[method-assign]
        handle = await backend.launch(plan)
        ended = await watch(backend, handle, timeout=60)
        await eventually(lambda: asyncio.sleep(0, seen), lambda s: "exited" in s, timeout=60)
    assert ended.reason in {"cancelled", "killed"}, ended
    assert "started" not in seen  # no runner: the worker's end says so


async def test_a_worker_sweeps_what_workers_killed_outright_left(
    backend: PoolBackend,  # noqa: F811
    nats_url: str,
    tmp_path: Path,
) -> None:
    """A worker killed outright (OOM, SIGKILL) left its directory — its runs' inputs, tokens
    included, its warm workspaces — for good: the next worker had another id. A worker sweeps
    the directories whose lock nobody holds; a live worker's, and what is not a worker's, stay."""
    work = tmp_path / "work"
    hour_ago = time.time() - 3600

    def worker_dir(name: str) -> Path:
        path = work / name
        (path / "runs" / "a.1").mkdir(parents=True)
        (path / "runs" / "a.1" / "input.json").write_text('{"token": "t"}')
        (path / ".lock").touch()
        os.utime(path / ".lock", (hour_ago, hour_ago))
        return path

    dead, live = worker_dir("dead"), worker_dir("live")
    (work / "not-a-worker").mkdir()
    with (live / ".lock").open("ab") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # its worker runs
        async with in_process_worker(nats_url, backend.topology.namespace, work, worker_id="sw"):
            await wait_workers(backend, "sw")
            assert not dead.exists()
            assert (live / "runs" / "a.1" / "input.json").exists()
            assert (work / "not-a-worker").is_dir()
