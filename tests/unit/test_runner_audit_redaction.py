"""A failed tool call's audit record (`activation.tool_call_finished`, durable and shown to the
project's members) carries its error text redacted like the history's copy: a command that
printed the environment before it timed out leaks no provider key into the log. The model is
the scripted model server (the one allowed fake); the broker is an `httpx.MockTransport`, so
these are the runner's own decisions about what it sends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from suzumio.contracts.runner import (
    RunnerToolpackSpec,
    ToolDefinition,
)
from suzumio.contracts.toolpacks import ToolpackManifest
from suzumio.contracts.values import ModelSpec
from suzumio.runner.agent import AgentLoop
from suzumio.runner.broker import BrokerClient
from suzumio.runner.live import LiveStream
from suzumio.runner.model import Endpoint, ModelClient
from suzumio.runner.toolbox import Toolbox
from suzumio.runner.tools.base import ToolContext, ToolResult
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from tests.unit.loop_support import TOKEN, Broker, spec

SECRET = "sk-secret-123456"


def leaky_dump(_: dict[str, Any], __: ToolContext) -> ToolResult:
    """A command that printed the environment, then ran out of time."""
    return ToolResult(f"K={SECRET}\nT={TOKEN}\n", "timeout")


async def test_a_failed_calls_audited_error_is_redacted(tmp_path: Path) -> None:
    broker = Broker()
    http = httpx.AsyncClient(base_url="http://broker", transport=httpx.MockTransport(broker.answer))
    client = BrokerClient("http://broker", TOKEN, http=http)
    activation = spec(
        tmp_path, toolpacks=(RunnerToolpackSpec(name="leaky", tools=("leaky.dump",)),)
    )
    manifest = ToolpackManifest(
        name="leaky",
        tools=(ToolDefinition(name="leaky.dump"),),
        runner_handlers={"leaky.dump": f"{__name__}:leaky_dump"},
    )
    toolbox = Toolbox(activation, client, ToolContext(workspace=tmp_path), {"leaky": manifest})
    async with ScriptedModelServer() as server:
        server.script([Reply.tool_calls([ToolCall("leaky_dump", {})]), Reply.text("done")])
        model = ModelClient(ModelSpec(name="primary"), Endpoint(f"{server.url}/v1", "k"))
        loop = AgentLoop(activation, client, [model], toolbox, LiveStream(client), [SECRET])
        try:
            ending = await loop.run()
        finally:
            await model.close()
            await http.aclose()

    assert ending.reason == "completed"
    [finished] = broker.bodies["/runner/tool-calls/finish"]
    assert finished["status"] == "timeout"
    assert finished["error"] == "K=[redacted]\nT=[redacted]\n"
    sent = json.dumps(broker.bodies)
    assert SECRET not in sent
    assert TOKEN not in sent
