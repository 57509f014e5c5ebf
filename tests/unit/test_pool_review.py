"""The pool worker's pulling and its resident runners' pipes, without NATS: a dispatch handed
out as the worker is told to stop, a queue that answers a batch fetch with an error, and a
resident runner that writes lines that are not an activation's end."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from nats.js.errors import APIError

from suzumio.runner.forkserver import ForkServer, ResidentRun, _Resident
from suzumio.runner.worker import Worker, WorkerConfig


class FakeMsg:
    def __init__(self, pending: int = 0) -> None:
        self.metadata = SimpleNamespace(num_pending=pending)
        self.data = b"{}"  # no dispatch this worker could have had before
        self.naked = False

    async def nak(self) -> None:
        self.naked = True


class FakeSub:
    """Hands out what each fetch is given to hand out, or raises it; `during` runs while a
    fetch waits (the worker told to stop, say)."""

    def __init__(self, *answers: list[FakeMsg] | Exception, during: Any = None) -> None:
        self.answers = list(answers)
        self.during = during

    async def fetch(self, batch: int, timeout: float) -> list[FakeMsg]:  # noqa: ARG002
        if self.during is not None:
            self.during()
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def worker(tmp_path: Path, taken: list[object], concurrency: int = 4) -> Worker:
    created = Worker(WorkerConfig(concurrency=concurrency, workdir=tmp_path, worker_id="wa"))

    async def handle(msg: object, *, own: bool = False) -> None:  # noqa: ARG001
        taken.append(msg)

    created._handle = handle  # type: ignore[method-assign]
    return created


async def test_a_dispatch_fetched_as_the_worker_stops_goes_back_to_the_queue(
    tmp_path: Path,
) -> None:
    """Not started here to be stopped by the drain (a failed attempt), nor held until its
    ack wait passes: handed back at once, for another worker."""
    taken: list[object] = []
    stop = asyncio.Event()
    msg = FakeMsg()
    await worker(tmp_path, taken)._pull_once(FakeSub([msg], during=stop.set), stop, asyncio.Event())  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert taken == []
    assert msg.naked


async def test_an_error_of_the_queue_on_a_batch_fetch_does_not_end_the_worker(
    tmp_path: Path,
) -> None:
    """nats-py raises a 503 (JetStream away) or a leader's change from a fetch: the worker's
    loop must go on (an exception out of `_pull_once` ended it: the worker drained and quit)."""
    taken: list[object] = []
    first = FakeMsg(pending=3)
    sub = FakeSub([first], APIError(code=503, description="no responders"))
    await worker(tmp_path, taken)._pull_once(sub, asyncio.Event(), asyncio.Event())  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert taken == [first]


async def test_a_resident_runners_lines_end_only_its_own_activations() -> None:
    """What a resident runner writes ends an activation only as its end, and only one sent
    to it: anything else would read to the worker as some runner's end."""
    server = ForkServer()
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    other_r, other_w = os.pipe()
    other_replies_r, other_replies_w = os.pipe()
    ours = _Resident(server, 4242, requests_w, replies_r)
    other = _Resident(server, 77, other_w, other_replies_r)
    runs = {i: ResidentRun(4242) for i in (3, 4, 5)} | {6: ResidentRun(77)}
    server._runs.update(runs)
    ours.runs.update({i: runs[i] for i in (3, 4, 5)})
    other.runs[6] = runs[6]
    lines = [
        "not json", "[1]", '"text"', "7", '{"pid": 77, "code": 0}', '{"id": 3}',
        '{"id": "3", "done": 0}', '{"id": 3, "done": 0, "tail": 5}',
        json.dumps({"id": 4, "done": 1, "tail": "the end", "pid": 77}),
        json.dumps({"id": 6, "done": 0}),  # another runner's activation
    ]  # fmt: skip
    data = ("\n".join(lines) + "\n" + json.dumps({"id": 5, "done": 0})).encode()
    try:
        os.write(replies_w, data[:50])
        ours.drain()
        os.write(replies_w, data[50:])  # the last line is not whole yet
        ours.drain()
        assert [i for i, run in runs.items() if run.returncode is not None] == [4]
        assert runs[4].tail == "the end"
        os.write(replies_w, b"\n")
        ours.drain()
        assert (runs[4].returncode, runs[5].returncode) == (1, 0)
        assert runs[3].returncode is None
        assert runs[6].returncode is None
        assert set(server._runs) == {3, 6}
        ours.send(b"a request\n")
        assert os.read(requests_r, 100) == b"a request\n"
    finally:
        ours.close()
        other.close()
        for fd in (requests_r, replies_w, other_r, other_replies_w):
            os.close(fd)


async def test_a_bind_under_way_when_the_worker_stops_does_not_take_routed_dispatches_again(
    tmp_path: Path,
) -> None:
    """The stop says at once that routed dispatches are no longer taken here; a bind of the
    worker's own consumer that finished after it said otherwise in the drain's beats, and an
    orchestrator routed warm sessions' next dispatches to a worker on its way out."""
    created = worker(tmp_path, [])
    stop = asyncio.Event()
    created._stop = stop

    stops = [True, False]

    async def bind() -> object:
        if stops.pop(0):
            stop.set()  # the stop comes while the bind is under way
        return object()

    created._bind_own = bind  # type: ignore[method-assign,assignment]
    assert await created._bind_own_or_note() is not None
    assert created._own_bound is False

    stop.clear()  # not stopping: a bind does say so
    assert await created._bind_own_or_note() is not None
    assert created._own_bound is True


def test_a_forked_runner_survives_a_write_to_a_broken_connection() -> None:
    """SIGPIPE stays ignored in a forked runner, as in any Python: asyncio and uvloop write
    with no MSG_NOSIGNAL, and at its default the signal killed a runner (a warm one with its
    session) on a connection the far end reset, where the write should fail and be retried."""
    code = (
        "import os\n"
        "from suzumio.runner.forkserver import child_signals\n"
        "child_signals()\n"
        "r, w = os.pipe()\n"
        "os.close(r)\n"
        "try:\n"
        "    os.write(w, b'x')\n"
        "except BrokenPipeError:\n"
        "    print('an error, not a death')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == b"an error, not a death"
