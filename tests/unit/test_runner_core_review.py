"""The runner's loop and its calls out, against what a sandbox, a model or the broker can throw
at them: an output file whose name is not UTF-8 (kubernetes mode), a grace summary or a reply
that the history could not hold, and a model that never stops streaming.

The model is the scripted model server (the one allowed fake) through the real openai SDK, or,
for a stream that never ends, an `httpx.MockTransport` serving one; the broker is an
`httpx.MockTransport`, so what is asserted is what the runner decides to send."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from suzumio.contracts.broker import ToolCallStart
from suzumio.contracts.runner import FileExchange, RunnerActivationInput, RunnerConfig
from suzumio.contracts.values import ModelSpec
from suzumio.runner import exits, model
from suzumio.runner.agent import AgentLoop, Ending
from suzumio.runner.broker import BrokerClient, OutputChangedError
from suzumio.runner.connections import Connections
from suzumio.runner.handover import send_outputs
from suzumio.runner.live import LiveStream
from suzumio.runner.main import Reported, run_activation
from suzumio.runner.model import Endpoint, ModelClient
from suzumio.runner.toolbox import Toolbox
from suzumio.runner.tools.base import ToolContext
from suzumio.testing.inprocess import InProcessServer
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from tests.unit.loop_support import TOKEN, Broker, spec

BAD_NAME = b"report-\xff.txt"  # not UTF-8: Python keeps it as a lone surrogate


def _client(broker: Broker) -> tuple[BrokerClient, httpx.AsyncClient]:
    http = httpx.AsyncClient(base_url="http://broker", transport=httpx.MockTransport(broker.answer))
    return BrokerClient("http://broker", TOKEN, http=http), http


class _Uploads(Broker):
    """Also takes output files (their body is raw bytes, not JSON)."""

    def __init__(self) -> None:
        super().__init__()
        self.uploads: list[str] = []

    def answer(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/runner/files/out/"):
            self.uploads.append(request.url.params["path"])
            return httpx.Response(200, json={"recorded": True})
        return super().answer(request)


def _outbox(workspace: Path) -> None:
    out = workspace / "out"
    out.mkdir(parents=True)
    (out / os.fsdecode(BAD_NAME)).write_bytes(b"lost?")
    (out / "good.txt").write_text("kept")


# --- output files whose name is not UTF-8 ----------------------------------------------------


async def test_an_output_named_in_other_bytes_than_utf8_is_skipped_and_the_rest_go(
    tmp_path: Path,
) -> None:
    _outbox(tmp_path)
    broker = _Uploads()
    client, http = _client(broker)
    try:
        files = FileExchange(max_output_files=10, max_output_bytes=1_000)
        assert await send_outputs(client, tmp_path, files) == 1
    finally:
        await http.aclose()
    assert broker.uploads == ["good.txt"]


class _KeptBroker(Connections):
    """A resident runner's clients, with the broker's on the mock transport (`answer`: in
    place of the broker's own)."""

    def __init__(self, broker: Broker, answer: Any = None) -> None:
        super().__init__()
        self._answer = answer or broker.answer

    def broker(self, base_url: str, timeout: float) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=base_url, timeout=timeout, transport=httpx.MockTransport(self._answer)
        )


async def _run_activation(
    activation: RunnerActivationInput, replies: list[Reply], broker: Broker, key: str = "k"
) -> int:
    """`run_activation` (the runner's whole run) against a scripted model; its exit code."""
    kept = _KeptBroker(broker)
    async with ScriptedModelServer() as server:
        server.script(replies)
        env = {"SUZUMIO_MODEL_BASE_URL": f"{server.url}/v1", "SUZUMIO_MODEL_API_KEY": key}
        try:
            return await run_activation(activation, env, kept)
        finally:
            await kept.aclose()


async def test_a_kubernetes_runner_with_such_an_output_still_makes_its_final_call(
    tmp_path: Path,
) -> None:
    """Before: httpx failed to encode the name into the upload's query (UnicodeEncodeError),
    which nothing caught: the runner exited 1 with no output recorded at all."""
    _outbox(tmp_path)
    broker = _Uploads()
    activation = spec(tmp_path).model_copy(
        update={"files": FileExchange(max_output_files=10, max_output_bytes=1_000)}
    )
    code = await _run_activation(activation, [Reply.text("done")], broker)
    assert code == exits.COMPLETED
    assert broker.uploads == ["good.txt"]
    [output] = broker.bodies["/activation-output"]
    assert (output["text"], output["reason"]) == ("done", "completed")


class _HeldUploads(Broker):
    """Holds every output file's upload, for good: a large file going up."""

    def __init__(self) -> None:
        super().__init__()
        self.uploading = asyncio.Event()

    async def held(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/runner/files/out/"):
            self.uploading.set()
            await asyncio.Event().wait()
        return self.answer(request)


async def _stopped_when(
    activation: RunnerActivationInput, broker: Broker, kept: Connections, reached: asyncio.Event
) -> None:
    """Run `activation` (its model answers "done"), stop it (SIGTERM: its task cancelled) once
    it `reached` the point under test; the stop takes effect, and the answer was reported."""
    reported = Reported()
    async with ScriptedModelServer() as server:
        server.script([Reply.text("done")])
        env = {"SUZUMIO_MODEL_BASE_URL": f"{server.url}/v1", "SUZUMIO_MODEL_API_KEY": "k"}
        running = asyncio.ensure_future(run_activation(activation, env, kept, reported))
        try:
            await asyncio.wait_for(reached.wait(), 30)
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running
        finally:
            running.cancel()
            await kept.aclose()
    [output] = broker.bodies["/activation-output"]
    assert (output["text"], output["reason"]) == ("done", "completed")
    assert reported.code == exits.COMPLETED


async def test_a_stop_while_the_files_go_up_still_reports_the_answer(tmp_path: Path) -> None:
    """A stop (SIGTERM: a cancel, a drain) that came while `out/` went up lost the answer of
    an activation whose work was done: no final call, and the orchestrator took it for
    unfinished work. The files not sent yet are dropped; the output is recorded, then the
    stop takes effect — the runner exits with the code the output was recorded with."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "large.txt").write_text("x" * 100)
    broker = _HeldUploads()
    activation = spec(tmp_path).model_copy(
        update={"files": FileExchange(max_output_files=10, max_output_bytes=1_000)}
    )
    await _stopped_when(activation, broker, _KeptBroker(broker, broker.held), broker.uploading)


async def test_a_stop_while_the_last_live_batch_goes_still_reports_the_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The live stream's last batch is let finish before the final call; a stop that came
    meanwhile cancelled the run there, and the done work's answer was never sent."""
    finishing = asyncio.Event()
    real = LiveStream.finish

    async def slow(self: LiveStream) -> Any:
        finishing.set()
        await asyncio.sleep(0.3)  # a batch on its way
        return await real(self)

    monkeypatch.setattr(LiveStream, "finish", slow)
    broker = Broker()
    await _stopped_when(spec(tmp_path), broker, _KeptBroker(broker), finishing)


# --- an output file that changes while it is sent ------------------------------------------


class _HttpBroker:
    """The broker's side over real HTTP (uvicorn, h11), which holds a body to its declared
    Content-Length as the tool-broker's server does; `httpx.MockTransport` does not."""

    def __init__(self) -> None:
        self.bodies: dict[str, list[Any]] = {}
        self.uploads: dict[str, bytes] = {}
        self.server = InProcessServer(
            Starlette(routes=[Route("/{rest:path}", self._answer, methods=["GET", "POST", "PUT"])])
        )

    async def _answer(self, request: Request) -> JSONResponse:
        body = await request.body()
        path = request.url.path
        if path.startswith("/runner/files/out/"):
            self.uploads[request.query_params["path"]] = body
        else:
            self.bodies.setdefault(path, []).append(json.loads(body) if body else {})
        if path == "/runner/signals":
            return JSONResponse({"signals": []})
        return JSONResponse({"recorded": True})

    async def __aenter__(self) -> str:
        return f"http://127.0.0.1:{await self.server.start('broker')}"

    async def __aexit__(self, *_: object) -> None:
        await self.server.stop()


async def test_an_output_that_grew_or_shrank_since_it_was_looked_at(tmp_path: Path) -> None:
    """The body was the file as it was read, under the Content-Length of its earlier size:
    h11 raised its own LocalProtocolError (neither an httpx error nor a refusal), which
    nothing caught — the runner exited 1 and the activation's output was lost. Now what grew
    goes as it was when looked at; what shrank is skipped (an OSError)."""
    grown = tmp_path / "grown"
    grown.write_bytes(b"a" * 1_000)
    shrunk = tmp_path / "shrunk"
    shrunk.write_bytes(b"b" * 10)
    broker = _HttpBroker()
    async with broker as url:
        client = BrokerClient(url, TOKEN)
        try:
            with grown.open("rb") as source:
                assert await client.upload(0, "grown", source, 600)
            with shrunk.open("rb") as source, pytest.raises(OutputChangedError):
                await client.upload(1, "shrunk", source, 20)
        finally:
            await client.aclose()
    assert broker.uploads == {"grown": b"a" * 600}


async def test_a_background_writer_ends_before_the_outputs_are_sent(tmp_path: Path) -> None:
    """A command's background process (`writer &`) lived on while a kubernetes runner sent
    `out/`: a file it kept writing changed between being looked at and being sent, and the
    activation crashed without its output. It ends with the loop now, as it does where the
    platform collects `out/` after the runner has exited (process, docker, pool). A real
    runner process: only it is the subreaper its commands' orphans go to."""
    workspace = tmp_path / "workspace"
    (workspace / "out").mkdir(parents=True)
    writer = "(while :; do echo line >> out/log.txt; done) > /dev/null 2>&1 &"
    replies = [
        Reply.tool_calls([ToolCall("shell_exec", json.dumps({"command": writer}))]),
        Reply.text("done", delay=0.3),
    ]
    broker = _HttpBroker()
    async with broker as url, ScriptedModelServer() as server:
        server.script(replies)
        activation = spec(workspace).model_copy(
            update={
                "controller_url": url,
                "files": FileExchange(max_output_files=10, max_output_bytes=100_000_000),
            }
        )
        input_file = tmp_path / "input.json"
        input_file.write_text(activation.model_dump_json())
        env = {
            "PATH": os.environ["PATH"],
            "SUZUMIO_MODEL_BASE_URL": f"{server.url}/v1",
            "SUZUMIO_MODEL_API_KEY": "k",
        }
        runner = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "suzumio.runner",
            "run",
            str(input_file),
            env=env,
            stderr=asyncio.subprocess.PIPE,
        )
        _, stderr = await asyncio.wait_for(runner.communicate(), 60)
    assert runner.returncode == exits.COMPLETED, stderr.decode()[-2_000:]
    sent = broker.uploads["log.txt"]
    assert sent
    await asyncio.sleep(0.2)
    assert sent == (workspace / "out" / "log.txt").read_bytes()  # no writer left
    [output] = broker.bodies["/activation-output"]
    assert output["text"] == "done"


# --- replies the history could not hold ------------------------------------------------------


async def _run(
    activation: RunnerActivationInput, replies: list[Reply], broker: Broker
) -> tuple[Ending, ScriptedModelServer]:
    client, http = _client(broker)
    toolbox = Toolbox(activation, client, ToolContext(workspace=Path(activation.workspace)))
    async with ScriptedModelServer() as server:
        server.script(replies)
        primary = ModelClient(ModelSpec(name="primary"), Endpoint(f"{server.url}/v1", "k"))
        loop = AgentLoop(activation, client, [primary], toolbox, LiveStream(client))
        try:
            return await loop.run(), server
        finally:
            await primary.close()
            await http.aclose()


def _with(workspace: Path, **config: Any) -> RunnerActivationInput:
    return spec(workspace).model_copy(update={"runner": RunnerConfig(**config)})


async def test_a_grace_summary_with_a_nul_or_a_lone_surrogate_is_recorded(tmp_path: Path) -> None:
    """The main loop makes a reply's text fit for the history (`printable`); the grace call's
    reply went to the history as it came, and a NUL made building its entry raise: the
    activation crashed (exit 1) with no output instead of ending `budget_exhausted`."""
    (tmp_path / "a.txt").write_text("a")
    replies = [
        Reply.tool_calls([ToolCall("file_read", json.dumps({"path": "a.txt"}))]),
        # The grace call offers no tools: calls in its reply are never run, nor recorded.
        Reply.tool_calls([ToolCall("file_read", "{}")], content="half\x00way \ud800 there"),
    ]
    ending, _ = await _run(_with(tmp_path, max_model_calls=1), replies, Broker())
    assert ending.reason == "budget_exhausted"
    assert ending.text == "half\\0way \\ud800 there"
    [entry] = ending.history
    assert entry.text == ending.text
    assert entry.tool_calls == ()


async def test_a_reply_longer_than_a_history_entry_is_cut_not_a_crash(tmp_path: Path) -> None:
    """A provider that ignores `max_tokens` can send more text than a history entry holds
    (1 M characters): building the entry raised, and the activation crashed with no output.
    The reading stops at the limit, as a reply cut off by the output cap."""
    long = "x" * (model.MAX_TEXT_CHARS + 10)
    replies = [Reply.text(long)] * 2
    activation = _with(tmp_path, max_output_tokens=16_384, max_output_tokens_cap=32_768)
    ending, server = await _run(activation, replies, Broker())
    assert ending.reason == "completed"
    assert len(server.completion_requests) == 2  # asked again with the cap doubled, once
    assert ending.text == "x" * model.MAX_TEXT_CHARS
    [entry] = ending.history
    assert len(entry.text) == model.MAX_TEXT_CHARS


# --- a model that streams for ever -----------------------------------------------------------


def _endless(request: httpx2.Request) -> httpx2.Response:
    async def events() -> AsyncIterator[bytes]:
        chunk = {"choices": [{"index": 0, "delta": {"content": "y" * 10_000}}]}
        line = f"data: {json.dumps(chunk)}\n\n".encode()
        for _ in range(10_000_000):  # 100 G characters: never reached
            yield line

    return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=events())


async def test_a_model_that_streams_for_ever_is_read_only_up_to_a_bound() -> None:
    """The reply was gathered with no bound: a provider that ignores `max_tokens` (or a
    proxy looping) grew the runner's memory until the wall-clock limit or the OOM killer."""
    client = ModelClient(ModelSpec(name="m"), Endpoint("http://model/v1", "k"))
    await client.close()
    client._client = openai.AsyncOpenAI(  # noqa: SLF001 - the endless stream's transport
        base_url="http://model/v1",
        api_key="k",
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(_endless)),
    )
    seen = 0

    def on_text(delta: str) -> None:
        nonlocal seen
        seen += len(delta)

    try:
        async with asyncio.timeout(60):
            turn = await client.complete([{"role": "user", "content": "go"}], [], 10, on_text)
    finally:
        await client._client.close()  # noqa: SLF001
    assert turn.finish_reason == "length"
    assert len(turn.text) == model.MAX_TEXT_CHARS
    assert seen <= model.MAX_TEXT_CHARS + 10_000


# --- the wall-clock limit in the middle of a tool round --------------------------------------


async def test_a_call_the_wall_clock_limit_stopped_is_not_left_running(tmp_path: Path) -> None:
    """The limit cancels the round before it records the end of the calls it runs: their
    audit showed them running for ever (`tool_calls.status = 'running'`)."""
    command = json.dumps({"command": "sleep 30", "timeout_seconds": 60})
    replies = [Reply.tool_calls([ToolCall("shell_exec", command, id="slow")])]
    broker = Broker()
    activation = _with(tmp_path, wall_clock_seconds=1.5)
    code = await _run_activation(activation, replies, broker)
    assert code == exits.TIMED_OUT
    [started] = broker.bodies["/runner/tool-calls/start"]
    [finished] = broker.bodies["/runner/tool-calls/finish"]
    assert finished["call_id"] == started["call_id"] == "slow"
    assert finished["status"] == "timeout"
    assert "ran out of time" in finished["error"]
    [output] = broker.bodies["/activation-output"]
    assert output["reason"] == "failed"


# --- secrets in the output -------------------------------------------------------------------


async def test_a_provider_error_that_echoes_the_key_does_not_put_it_in_the_output(
    tmp_path: Path,
) -> None:
    """A failed model's error text becomes the output (`activation.output_recorded`, shown by
    the API): a provider or proxy that echoes the key it refused put the key there, though the
    runner's log redacted it."""
    key = "sk-live-0123456789abcdef"
    message = f"Invalid API key provided: {key}"
    body = {"error": {"message": message, "type": "invalid_request_error"}}
    broker = Broker()
    code = await _run_activation(spec(tmp_path), [Reply.error(401, body)], broker, key)
    assert code == exits.MODEL_REFUSED
    [output] = broker.bodies["/activation-output"]
    assert "Invalid API key provided: [redacted]" in output["text"]
    assert key not in json.dumps(broker.bodies)


async def test_the_audit_says_which_calls_used_a_tool_that_changes_nothing(tmp_path: Path) -> None:
    """The scheduler's nudge rule counts a tool call's success as an effect unless its tool
    is read-only (DESIGN.md §6): the start of each call says which it is."""
    (tmp_path / "a.txt").write_text("a")
    calls = [
        ToolCall("file_read", json.dumps({"path": "a.txt"}), id="read"),
        ToolCall("file_write", json.dumps({"path": "b.txt", "content": "b"}), id="write"),
    ]
    broker = Broker()
    code = await _run_activation(
        spec(tmp_path), [Reply.tool_calls(calls), Reply.text("ok")], broker
    )
    assert code == exits.COMPLETED
    bodies = broker.bodies["/runner/tool-calls/start"]
    started = {b["call_id"]: b.get("read_only", False) for b in bodies}
    assert started == {"read": True, "write": False}
    # Left out when false: a broker from before the field refuses unknown fields.
    assert ["read_only" in b for b in bodies] == [True, False]
    assert (tmp_path / "b.txt").read_text() == "b"


async def test_a_broker_older_than_read_only_gets_the_start_without_it() -> None:
    """A runner image newer than its broker: the broker refuses the unknown field (422), and
    the tool call failed the whole activation ("the tool-broker refused a request")."""
    sent: list[dict[str, object]] = []

    def older(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        if "read_only" in body:
            return httpx.Response(422, json={"detail": "read_only: extra inputs are not permitted"})
        return httpx.Response(200, json={"recorded": True})

    http = httpx.AsyncClient(base_url="http://broker", transport=httpx.MockTransport(older))
    client = BrokerClient("http://broker", TOKEN, http=http)
    start = ToolCallStart(
        call_id="c1", tool="file.read", arguments_digest="0" * 64, arguments_size=2, read_only=True
    )
    try:
        assert (await client.start_call(start)).recorded
    finally:
        await http.aclose()
    assert [b.get("read_only") for b in sent] == [True, None]
