"""A pool worker whose NATS connection fails while it brings a run's inputs in (closed,
draining, its buffer full: errors nats-py raises that are no JetStream API error) reports the
run's end as a failed start, and acks: it does not let the run's task die with neither, which
left the dispatch unanswered until its ack wait passed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from nats.errors import ConnectionClosedError, OutboundBufferLimitError

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
    run = SimpleNamespace(dispatch=SimpleNamespace(inputs=("in.txt",)), warm_key=None)

    await worker._execute(run)  # type: ignore[arg-type]

    [(kind, fields)] = ended
    assert (kind, fields["reason"]) == ("exited", "spawn_failed")
