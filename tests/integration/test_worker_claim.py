"""A pool worker claims a dispatch before it starts it (`CLAIMS`): a write whose outcome it
cannot learn — NATS slow, or this worker cut off from it, the very case in which the queue
hands the dispatch to another worker after the ack wait — no longer starts the run
unclaimed beside that worker's. Real NATS; the worker's JetStream publishes are wrapped to
lose their answers (the write made, or not), as a worker cut off sees them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from nats.aio.client import Client as NATS
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import NoStreamResponseError

from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.runner import worker as worker_module
from suzumio.runner.worker import Worker, WorkerConfig

Publish = Callable[..., Awaitable[Any]]


@pytest.fixture(autouse=True)
def _short_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_module, "CLAIM_PAUSES_SECONDS", (0.01, 0.01, 0.01))


def worker_on(nc: NATS, topology: Topology, tmp_path: Path, worker_id: str) -> Worker:
    worker = Worker(
        WorkerConfig(namespace=topology.namespace, workdir=tmp_path, worker_id=worker_id)
    )
    worker._nc = nc  # noqa: SLF001 - the test's connection, no worker loop around it
    return worker


def run_of(dispatch_id: str) -> Any:
    """What `_claim` reads of a run: its dispatch's id and deadline, and whether it stops."""
    deadline = datetime.now(UTC) + timedelta(minutes=5)
    return SimpleNamespace(
        dispatch=SimpleNamespace(dispatch_id=dispatch_id, deadline=deadline), stop_reason=None
    )


def answers_lost(worker: Worker, *, first_written: bool, times: int) -> list[str]:
    """The worker's next `times` claim writes lose their answer (a timeout); the first of
    them reaches the server all the same when `first_written`. The subjects written."""
    real: Publish = worker.js.publish
    seen: list[str] = []

    async def publish(subject: str, payload: bytes, **options: Any) -> Any:
        seen.append(subject)
        if len(seen) > times:
            return await real(subject, payload, **options)
        if len(seen) == 1 and first_written:
            await real(subject, payload, **options)
        raise NatsTimeoutError

    worker.js.publish = publish  # type: ignore[method-assign,assignment]
    return seen


async def claim(worker: Worker, dispatch_id: str) -> str:
    return cast("str", await worker._claim(run_of(dispatch_id)))  # noqa: SLF001


@pytest.mark.parametrize(
    ("first_written", "lost", "outcome", "next_worker"),
    [
        # Written, its answer lost: written again, its own claim is found; the worker the
        # queue hands the dispatch to after the ack wait finds it claimed.
        (True, 1, "ours", "theirs"),
        # Never answered: given back, not started; nothing was written, and the worker it
        # goes to next claims and runs it.
        (False, 10, "unknown", "ours"),
    ],
    ids=["answer-lost", "never-answered"],
)
async def test_a_claim_whose_write_goes_unanswered(
    nc: NATS,
    topology: Topology,
    tmp_path: Path,
    *,
    first_written: bool,
    lost: int,
    outcome: str,
    next_worker: str,
) -> None:
    dispatch_id = f"{new_id()}.1"
    first = worker_on(nc, topology, tmp_path, "wa")
    tries = answers_lost(first, first_written=first_written, times=lost)

    assert await claim(first, dispatch_id) == outcome
    assert len(tries) == min(lost + 1, 1 + len(worker_module.CLAIM_PAUSES_SECONDS))
    assert await claim(worker_on(nc, topology, tmp_path, "wb"), dispatch_id) == next_worker


@pytest.mark.parametrize("stream_there", [False, True], ids=["no-stream", "electing"])
async def test_a_claim_no_stream_answers(
    nc: NATS, topology: Topology, tmp_path: Path, *, stream_there: bool
) -> None:
    """No stream answers any try: a platform from before `CLAIMS` — the stream is not there —
    runs it unclaimed, as before; but on a cluster a stream electing its leader answers
    "no responders" too, to the very worker this guards against: unknown, given back."""
    if not stream_there:
        await nc.jetstream().delete_stream(topology.claims_stream)
    worker = worker_on(nc, topology, tmp_path, "wa")
    tried: list[str] = []

    async def publish(subject: str, payload: bytes, **options: Any) -> Any:
        tried.append(subject)
        raise NoStreamResponseError

    worker.js.publish = publish  # type: ignore[method-assign,assignment]
    outcome = "unknown" if stream_there else "ours"
    assert await claim(worker, f"{new_id()}.1") == outcome
    assert len(tried) == 1 + len(worker_module.CLAIM_PAUSES_SECONDS)
