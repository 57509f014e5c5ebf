"""A pool worker whose NATS connection fails while it brings a run's inputs in (closed,
draining, its buffer full: errors nats-py raises that are no JetStream API error) reports the
run's end as a failed start, and acks: it does not let the run's task die with neither, which
left the dispatch unanswered until its ack wait passed; and a resident runner that never
started leaves neither its cgroup nor its log behind."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from nats.errors import ConnectionClosedError, OutboundBufferLimitError

from suzumio.runner.limits import Sandbox
from suzumio.runner.worker import Worker, WorkerConfig


@pytest.mark.parametrize("error", [ConnectionClosedError(), OutboundBufferLimitError()])
async def test_a_nats_failure_while_bringing_inputs_in_ends_the_run_as_a_failed_start(
    tmp_path: Path, error: Exception
) -> None:
    worker = Worker(WorkerConfig(concurrency=1, workdir=tmp_path, worker_id="wa"))
    ended: list[tuple[str, dict[str, Any]]] = []

    async def objects() -> None:
        raise error

    async def finish(_run: object, status: tuple[str, dict[str, Any]]) -> None:
        ended.append(status)

    worker._objects = objects  # type: ignore[assignment,method-assign]
    worker._finish = finish  # type: ignore[assignment,method-assign]
    worker._status = lambda _dispatch, kind, **fields: (kind, fields)  # type: ignore[assignment,method-assign]
    run = SimpleNamespace(
        dispatch=SimpleNamespace(inputs=("in.txt",)),
        warm_key=None,
        stop_reason=None,
        halted=asyncio.Event(),
    )

    await worker._execute(run)  # type: ignore[arg-type]

    [(kind, fields)] = ended
    assert (kind, fields["reason"]) == ("exited", "spawn_failed")


@pytest.mark.parametrize("error", [TimeoutError, asyncio.CancelledError])
async def test_a_resident_runner_that_never_started_leaves_nothing(
    tmp_path: Path, error: type[BaseException]
) -> None:
    """The fork server slow to answer, or the run's task cancelled while it waited: the log
    made for the runner stayed for as long as the worker lived (and at a cancel, its cgroup
    too), one per such start."""
    worker = Worker(WorkerConfig(workdir=tmp_path, worker_id="wr"))
    worker.root.mkdir()
    made: list[str] = []
    dropped: list[str] = []

    def sandbox(name: str, _limits: object) -> Sandbox:
        made.append(name)
        return Sandbox()

    class SlowForks:
        async def spawn_resident(self, _cwd: Path, log: Path, *_rest: object) -> None:
            log.write_bytes(b"")  # the fork server's child opened it
            raise error

    worker._sandbox = sandbox  # type: ignore[assignment,method-assign]
    worker._drop_cgroup = dropped.append  # type: ignore[assignment,method-assign]
    run = SimpleNamespace(dispatch=SimpleNamespace(limits=None), workspace=tmp_path / "ws")
    with pytest.raises(error):
        await worker._run_resident(SlowForks(), run, "session", {})  # type: ignore[arg-type]
    assert len(made) == 1
    assert dropped == made
    assert list((worker.root / "residents").iterdir()) == []
    assert "session" not in worker._residents
