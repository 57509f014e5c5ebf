"""An activation that fails after it spent model calls says what it spent: before, the
endings the loop did not reach itself (the model failed, the time ran out, the broker refused)
reported an empty usage. The model is the scripted model server (the one allowed fake)."""

from __future__ import annotations

from pathlib import Path

import httpx

from suzumio.contracts.values import ModelSpec
from suzumio.runner import exits
from suzumio.runner.agent import AgentLoop
from suzumio.runner.broker import BrokerClient
from suzumio.runner.live import LiveStream
from suzumio.runner.main import _run_loop
from suzumio.runner.model import Endpoint, ModelClient
from suzumio.runner.toolbox import Toolbox
from suzumio.runner.tools.base import ToolContext
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from tests.unit.loop_support import TOKEN, Broker, spec


async def test_a_model_that_fails_after_a_round_leaves_its_calls_counted(tmp_path: Path) -> None:
    broker = Broker()
    http = httpx.AsyncClient(base_url="http://broker", transport=httpx.MockTransport(broker.answer))
    client = BrokerClient("http://broker", TOKEN, http=http)
    activation = spec(tmp_path)
    (tmp_path / "a.txt").write_text("x")
    toolbox = Toolbox(activation, client, ToolContext(workspace=tmp_path))
    async with ScriptedModelServer() as server:
        server.script(
            [
                Reply.tool_calls([ToolCall("file_read", {"path": "a.txt"})]),
                Reply.error(401, '{"error": {"message": "key revoked"}}'),
            ]
        )
        model = ModelClient(ModelSpec(name="primary"), Endpoint(f"{server.url}/v1", "k"))
        loop = AgentLoop(activation, client, [model], toolbox, LiveStream(client), [])
        try:
            ending, code = await _run_loop(activation, client, loop, tmp_path)
        finally:
            await model.close()
            await http.aclose()
    assert (ending.reason, code) == ("failed", exits.MODEL_REFUSED)  # a refused key
    assert ending.usage["model_calls"] == 1
    assert ending.usage["model"] == "primary"
