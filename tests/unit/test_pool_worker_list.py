"""A worker's answer to `pool.list` stays within the NATS server's max_payload, and the ends
it remembers for it are bounded in number, not only in time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from suzumio.contracts.ids import new_id
from suzumio.contracts.runner import PoolStatus, PoolWorkerInfo
from suzumio.runner import worker as worker_module
from suzumio.runner.worker import Worker, WorkerConfig, _fitting

START = datetime(2026, 1, 1, tzinfo=UTC)


def exited(n: int, detail: str = "") -> PoolStatus:
    activation = new_id()
    return PoolStatus(
        kind="exited", dispatch_id=f"{activation}.1", activation_id=activation, attempt=1,
        worker_id="wa", pool="default", at=START + timedelta(milliseconds=n), reason="exited",
        exit_code=1, detail=detail,
    )  # fmt: skip


def info(statuses: list[PoolStatus]) -> PoolWorkerInfo:
    return PoolWorkerInfo(
        worker_id="wa", pool="default", capacity=8, at=START, exited=tuple(statuses)
    )


def test_an_answer_that_fits_is_sent_as_it_is() -> None:
    small = info([exited(i, "boom") for i in range(10)])
    assert _fitting(small, 1 << 20) == small.model_dump_json().encode()


def test_ten_minutes_of_busy_exits_are_cut_to_the_newest_that_fit() -> None:
    statuses = [exited(i, "a failed run's log line\n" * 80) for i in range(3_000)]
    limit = 256 * 1024
    assert len(info(statuses).model_dump_json()) > 20 * limit

    body = _fitting(info(statuses), limit)

    assert len(body) <= limit
    answer = PoolWorkerInfo.model_validate_json(body)
    assert answer.exited, "some exits must still be named"
    newest = {s.dispatch_id for s in statuses[-len(answer.exited) :]}
    assert {s.dispatch_id for s in answer.exited} == newest
    assert all(len(s.detail) <= 200 for s in answer.exited)


class AckedMsg:
    async def ack_sync(self, timeout: float) -> None:  # noqa: ARG002
        return None


async def test_a_busy_workers_remembered_ends_are_bounded_in_number(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten minutes of ends at hundreds a second were all held in memory (and each listing
    serialised all of them on the worker's loop): the oldest now go first."""
    monkeypatch.setattr(worker_module, "RECENT_MAX", 50)
    worker = Worker(WorkerConfig(workdir=tmp_path, worker_id="wa"))

    async def published(_status: PoolStatus, *, flush: bool = False) -> None:  # noqa: ARG001
        return None

    worker._publish = published  # type: ignore[method-assign,assignment]
    statuses = [exited(i) for i in range(120)]
    for status in statuses:
        await worker._report_end(AckedMsg(), status)  # type: ignore[arg-type]
    kept = worker._info(with_exited=True).exited
    assert [s.dispatch_id for s in kept] == [s.dispatch_id for s in statuses[-50:]]
