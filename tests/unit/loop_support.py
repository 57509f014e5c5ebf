"""For unit tests of the agent loop: an activation's input, and the tool-broker's side of the
runner contract as an `httpx.MockTransport` handler that records every body the runner sends
and answers as the broker does when all is well — so a test asserts what the runner decided to
send. Tests that need the real broker's behaviour run against the service (tests/e2e)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from suzumio.contracts.runner import (
    ActivationSpec,
    AgentHistoryMessage,
    AgentSpec,
    ProjectRef,
    RunnerActivationInput,
    RunnerToolpackSpec,
    SessionRef,
)
from suzumio.contracts.values import ModelSpec
from suzumio.runner.agent import AgentLoop, Ending
from suzumio.runner.broker import BrokerClient
from suzumio.runner.live import LiveStream
from suzumio.runner.main import _run_loop
from suzumio.runner.model import Endpoint, ModelClient
from suzumio.runner.toolbox import Toolbox
from suzumio.runner.tools.base import ToolContext
from suzumio.testing.model.server import RecordedRequest
from suzumio.testing.model_server import Reply, ScriptedModelServer

TOKEN = "sza1.the-activations-own-token"


def spec(
    workspace: Path,
    history: tuple[AgentHistoryMessage, ...] = (),
    toolpacks: tuple[RunnerToolpackSpec, ...] = (),
) -> RunnerActivationInput:
    return RunnerActivationInput(
        project=ProjectRef(id="p" * 26, name="p"),
        agent=AgentSpec(id="a" * 26, role="r", prompt="p", model=ModelSpec(name="primary")),
        session=SessionRef(id="s" * 26),
        activation=ActivationSpec(id="x" * 26),
        workspace=str(workspace),
        controller_url="http://broker",
        token=TOKEN,
        history=history,
        toolpacks=toolpacks,
    )


class Broker:
    def __init__(self) -> None:
        self.bodies: dict[str, list[dict[str, Any]]] = {}

    def answer(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        self.bodies.setdefault(request.url.path, []).append(body)
        if request.url.path == "/runner/signals":
            return httpx.Response(200, json={"signals": []})
        return httpx.Response(200, json={"recorded": True})

    def tool_results(self) -> list[dict[str, Any]]:
        entries = (e for b in self.bodies.get("/runner/history", []) for e in b["entries"])
        return [e for e in entries if e["role"] == "tool"]


@dataclass
class LoopRun:
    ending: Ending
    code: int
    model_requests: list[RecordedRequest]  # what the model was sent, call by call


async def run_loop(
    tmp_path: Path,
    activation: RunnerActivationInput,
    replies: list[Reply],
    broker: Broker | None = None,
    *,
    retries: int = 5,
) -> LoopRun:
    """One activation's loop (`_run_loop`, as `run_activation` drives it) against the scripted
    model's `replies` and `broker` (a plain one by default); `retries`: of each broker call."""
    transport = httpx.MockTransport((broker or Broker()).answer)
    http = httpx.AsyncClient(base_url="http://broker", transport=transport)
    client = BrokerClient("http://broker", TOKEN, http=http, retries=retries)
    toolbox = Toolbox(activation, client, ToolContext(workspace=tmp_path))
    async with ScriptedModelServer() as server:
        server.script(replies)
        model = ModelClient(ModelSpec(name="primary"), Endpoint(f"{server.url}/v1", "k"))
        loop = AgentLoop(activation, client, [model], toolbox, LiveStream(client), [])
        try:
            ending, code = await _run_loop(activation, client, loop, tmp_path)
        finally:
            await model.close()
            await http.aclose()
        return LoopRun(ending, code, server.completion_requests)
