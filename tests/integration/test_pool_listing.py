"""What a pool worker says it runs when asked (`pool.list`, the orchestrator's reconciliation
and its backend's `list_live`): a run whose end it has told and acked is listed as exited,
not as running, even while its task is still letting go of it (real NATS, a worker in this
process whose runner is a stand-in script that exits at once)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from suzumio.contracts.runner import PoolStatus
from suzumio.orchestrator.backends.pool import PoolBackend
from tests.integration.test_pool_backend import (  # noqa: F401 - fixtures
    backend,
    make_plan,
    wait_workers,
    watch,
)
from tests.integration.test_pool_limits import in_process_worker


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
