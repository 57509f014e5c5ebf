"""DESIGN.md §11 end to end: one activation is one trace, and its metrics are on `/metrics`.

A message is posted through the gateway with a `traceparent` of the test's; the services export
their spans over OTLP/HTTP to a receiver in this process. The scheduler's decision span, the
orchestrator's launch span, the tool-broker's spans of the runner's calls and the `tool.call`
span of the tool the model asked for must all carry the request's trace id — the decision as a
child of the request's trace, the launch of the decision, the broker's as children of the
launch (the runner hands it on in `traceparent`). Then the
orchestrator's and the broker's `/metrics` show the new metrics: latency by stage, live
activations, model tokens and errors by class, tool calls by (bounded) tool name."""

from __future__ import annotations

import asyncio
import gzip
import re
import secrets
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from suzumio.contracts.events import ActivationRequested
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall, Usage
from tests.e2e.api import World, new_world, ok
from tests.e2e.stack import Stack, running_stack
from tests.support import eventually

SERVICES = ("session", "scheduler", "orchestrator", "toolbroker", "gateway")


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, object]


class _Receiver(BaseHTTPRequestHandler):
    spans: list[Span] = []
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - the standard library's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path.endswith("/v1/traces"):
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            with self.lock:
                type(self).spans.extend(_spans(request))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def _spans(request: ExportTraceServiceRequest) -> Iterator[Span]:
    for resource in request.resource_spans:
        service = next(
            (a.value.string_value for a in resource.resource.attributes if a.key == "service.name"),
            "",
        )
        for scope in resource.scope_spans:
            for span in scope.spans:
                attributes: dict[str, object] = {}
                for a in span.attributes:
                    kind = a.value.WhichOneof("value")
                    attributes[a.key] = getattr(a.value, kind) if kind else None
                yield Span(
                    service,
                    span.name,
                    span.trace_id.hex(),
                    span.span_id.hex(),
                    span.parent_span_id.hex(),
                    span.kind,
                    attributes,
                )


@pytest.fixture(scope="module")
def receiver() -> Iterator[str]:
    _Receiver.spans = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


@pytest_asyncio.fixture(scope="module")
async def scripted() -> AsyncIterator[ScriptedModelServer]:
    async with ScriptedModelServer() as server:
        yield server


@pytest_asyncio.fixture(scope="module")
async def traced(
    nats_url: str,
    postgres_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    scripted: ScriptedModelServer,
    receiver: str,
) -> AsyncIterator[Stack]:
    tmp = Path(tmp_path_factory.mktemp("traced"))
    env = {
        "SUZUMIO_MODEL_BASE_URL": f"{scripted.url}/v1",
        "SUZUMIO_MODEL_API_KEY": "sk-e2e-secret",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{receiver}/v1/traces",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    async with running_stack(nats_url, postgres_url, tmp, SERVICES, env) as stack:
        yield stack


async def _activation_of(stack: Stack, world: World) -> str:
    async def requested() -> list[str]:
        stream = await stack.store.load("session", world.session_id)
        return [
            e.data.activation_id for e in stream.events if isinstance(e.data, ActivationRequested)
        ]

    ids = await eventually(requested, lambda found: len(found) == 1, what="a request")
    return ids[0]


async def _ended(stack: Stack, activation_id: str) -> list[str]:
    async def story() -> list[str]:
        stream = await stack.store.load("activation", activation_id)
        return [e.envelope.type for e in stream.events]

    return await eventually(
        story,
        lambda types: "activation.completed" in types or "activation.failed" in types,
        timeout=60,
        what="the activation's end",
    )


async def _post(stack: Stack, world: World, text: str, traceparent: str | None = None) -> None:
    headers = {"traceparent": traceparent} if traceparent else {}
    async with stack.client(world.key) as c:
        ok(
            await c.post(
                f"/v1/sessions/{world.session_id}/messages", json={"text": text}, headers=headers
            ),
            201,
        )


def _of_trace(trace_id: str) -> list[Span]:
    with _Receiver.lock:
        return [s for s in _Receiver.spans if s.trace_id == trace_id]


async def _write_a_file(
    stack: Stack, scripted: ScriptedModelServer, world: World, traceparent: str | None = None
) -> str:
    """An activation that writes a file with a tool and answers (28 prompt tokens); its id."""
    scripted.script(
        [
            Reply.tool_calls(
                [ToolCall("file_write", {"path": "out/a.txt", "content": "traced"})],
                usage=Usage(prompt_tokens=11, completion_tokens=5),
            ),
            Reply.text("written", usage=Usage(prompt_tokens=17, completion_tokens=2)),
        ]
    )
    await _post(stack, world, "write it", traceparent)
    activation_id = await _activation_of(stack, world)
    assert "activation.completed" in await _ended(stack, activation_id)
    return activation_id


async def test_the_launch_and_the_brokers_tool_calls_are_in_the_requests_trace(
    traced: Stack, scripted: ScriptedModelServer
) -> None:
    world = await new_world(traced, "tracy")
    trace_id = secrets.token_hex(16)
    traceparent = f"00-{trace_id}-{secrets.token_hex(8)}-01"
    activation_id = await _write_a_file(traced, scripted, world, traceparent)

    def launched(spans: list[Span]) -> bool:
        names = {(s.service, s.name) for s in spans}
        return {
            ("suzumio-scheduler", "scheduler.decision"),
            ("suzumio-orchestrator", "activation.launch"),
            ("suzumio-toolbroker", "tool.call"),
        } <= names and any(
            s.service == "suzumio-toolbroker" and s.attributes.get("http.route") == path
            for s in spans
            for path in ("/activation-output",)
        )

    spans = await eventually(
        lambda: asyncio.sleep(0, _of_trace(trace_id)),
        launched,
        timeout=30,
        what="the launch's and the broker's spans in the request's trace",
    )
    # The scheduler's decision continues the trace of the signal it starts (the session
    # service's handling of the request), and the launch continues the decision's.
    [decision] = [s for s in spans if s.name == "scheduler.decision"]
    assert decision.attributes["suzumio.activation"] == activation_id
    assert decision.attributes["suzumio.kind"] == "start"
    assert decision.parent_id in {s.span_id for s in spans if s.service == "suzumio-session"}
    [launch] = [s for s in spans if s.name == "activation.launch"]
    assert launch.attributes["suzumio.activation"] == activation_id
    assert launch.parent_id == decision.span_id
    [tool] = [s for s in spans if s.name == "tool.call"]
    assert tool.parent_id == launch.span_id  # the runner's `traceparent`: the launch's
    assert tool.attributes["suzumio.tool"] == "file.write"
    broker = [s for s in spans if s.service == "suzumio-toolbroker" and s.name != "tool.call"]
    assert broker
    assert all(s.parent_id == launch.span_id for s in broker), broker
    [output] = [s for s in broker if s.attributes.get("http.route") == "/activation-output"]
    assert output.attributes.get("suzumio.prompt_tokens") == 28
    assert output.attributes.get("suzumio.activation") == activation_id


def _samples(text: str, name: str) -> dict[str, float]:
    """`{labels: value}` of one metric's samples in Prometheus text."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(rf"{name}(\{{[^}}]*\}})? (\S+)$", line)
        if m:  # its own labels, in order, without OpenTelemetry's scope
            pairs = re.findall(r'(\w+)="([^"]*)"', m.group(1) or "")
            own = sorted(f'{k}="{v}"' for k, v in pairs if not k.startswith("otel_scope_"))
            found["{" + ",".join(own) + "}" if own else ""] = float(m.group(2))
    return found


async def _metrics(stack: Stack, service: str) -> str:
    async with httpx.AsyncClient(base_url=stack.url_of(service), timeout=10) as c:
        response = await c.get("/metrics")
    assert response.status_code == 200
    return response.text


async def test_the_new_metrics_are_on_metrics(traced: Stack, scripted: ScriptedModelServer) -> None:
    await _write_a_file(traced, scripted, await new_world(traced, "metty"))
    world = await new_world(traced, "fanny")
    scripted.script([Reply.unauthorized()])
    await _post(traced, world, "fail for good")
    activation_id = await _activation_of(traced, world)
    assert "activation.failed" in await _ended(traced, activation_id)

    def counted(text: str) -> bool:
        errors = _samples(text, "suzumio_model_errors_total")
        return any('class="auth"' in k for k in errors)

    orchestrator = await eventually(
        lambda: _metrics(traced, "orchestrator"), counted, timeout=10, what="model errors"
    )
    stages = _samples(orchestrator, "suzumio_activation_stage_seconds_count")
    for stage in ("queued", "launching", "total"):
        assert any(f'stage="{stage}"' in k and v >= 1 for k, v in stages.items()), stages
    tokens = _samples(orchestrator, "suzumio_model_tokens_total")
    assert any('kind="prompt"' in k and v >= 28 for k, v in tokens.items()), tokens  # noqa: PLR2004
    live = _samples(orchestrator, "suzumio_activations_live")
    assert any('state="running"' in k for k in live), live
    assert all(v == 0 for v in live.values()), live  # both ended
    assert not any(activation_id in line for line in orchestrator.splitlines())

    broker = await _metrics(traced, "toolbroker")
    calls = _samples(broker, "suzumio_tool_calls_total")
    assert any('tool="file.write"' in k and 'status="started"' in k for k in calls), calls
    assert any('tool="file.write"' in k and 'status="ok"' in k for k in calls), calls
