"""A runner stopped (SIGTERM) once its loop has ended: the output being sent goes out whole,
and the runner ends with the code that output was recorded with, not as terminated — else the
orchestrator took a recorded answer for cancelled work (exit 9) and had it done again. A worker
draining, or a kill as the runner ends, sends exactly that signal.

The broker here is a loopback HTTP server that answers every call as the broker does when all
is well and holds the output's answer until the test lets it go; the model is the scripted
model server (the one allowed fake)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from suzumio.runner import exits
from suzumio.runner.main import _one, _Stops
from suzumio.testing.model_server import Reply, ScriptedModelServer
from tests.unit.loop_support import spec


class HeldBroker:
    def __init__(self) -> None:
        self.output_came = asyncio.Event()
        self.let_go = asyncio.Event()
        self.outputs: list[dict[str, object]] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                length = next(
                    (int(v) for k, _, v in (ln.partition(":") for ln in lines[1:])
                     if k.lower() == "content-length"),
                    0,
                )  # fmt: skip
                body = await reader.readexactly(length) if length else b""
                answer: object = {"recorded": True}
                if path.startswith("/runner/signals"):
                    answer = {"signals": []}
                if path == "/activation-output":
                    self.outputs.append(json.loads(body))
                    self.output_came.set()
                    await self.let_go.wait()
                data = json.dumps(answer).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(data), data)
                )
                await writer.drain()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        try:
            yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        finally:
            server.close()


@pytest.mark.parametrize("resident", [False, True], ids=["one-activation", "resident"])
async def test_a_stop_while_the_output_goes_out_ends_with_the_outputs_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, resident: bool
) -> None:
    """(A resident runner's handlers stay for all its activations: `_Stops`.)"""
    broker = HeldBroker()
    stops = _Stops(asyncio.get_running_loop()) if resident else None
    async with broker.running() as url, ScriptedModelServer() as model:
        model.script([Reply.text("the answer")])
        monkeypatch.setenv("SUZUMIO_MODEL_BASE_URL", f"{model.url}/v1")
        activation = spec(tmp_path).model_copy(update={"controller_url": url})
        running = asyncio.create_task(_one(activation, None, stops))
        await asyncio.wait_for(broker.output_came.wait(), 30)
        os.kill(os.getpid(), signal.SIGTERM)  # _one's handler takes it while it runs
        await asyncio.sleep(0.2)
        os.kill(os.getpid(), signal.SIGTERM)  # and a second stop does not cut it off either
        await asyncio.sleep(0.2)
        assert not running.done()  # the output's answer is still awaited
        broker.let_go.set()
        code = await asyncio.wait_for(running, 30)
        if stops is not None:
            assert stops.task is None  # a stop now would end the runner: nothing runs
            stops.close()
    assert code == exits.COMPLETED
    [output] = broker.outputs
    assert "the answer" in json.dumps(output)


def test_a_resident_runner_stopped_between_activations_ends_by_the_signal() -> None:
    """Between activations there is nothing to cancel: the runner ends as the signal's default
    action ends a process (its worker sees it killed by SIGTERM), handlers or not."""
    script = (
        "import asyncio, sys\n"
        "from suzumio.runner import eventloop\n"
        "from suzumio.runner.main import _Stops\n"
        "async def main():\n"
        "    _Stops(asyncio.get_running_loop())\n"
        "    print('ready', flush=True)\n"
        "    await asyncio.sleep(30)\n"
        "eventloop.run(main())\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
