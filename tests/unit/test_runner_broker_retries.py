"""How often a runner tries a broker it cannot reach is the runtime profile's (`loop.
broker_retries`, into the input's `runner.broker_retries`): the whole run, against a listener
that takes each connection and closes it at once, and a scripted model that answers."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from suzumio.contracts.runner import RunnerConfig
from suzumio.contracts.values import LoopSettings
from suzumio.runner import exits
from suzumio.runner.main import run_activation
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from tests.unit.loop_support import spec


class Unreachable:
    """A port that takes connections and drops them, unanswered: a transport error for every
    request (each request's path is counted)."""

    def __init__(self) -> None:
        self.tries: Counter[str] = Counter()

    async def __aenter__(self) -> str:
        async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            request_line = (await reader.readline()).decode(errors="replace").split()
            self.tries[request_line[1] if len(request_line) > 1 else "?"] += 1
            writer.close()

        self._server = await asyncio.start_server(drop, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *_: object) -> None:
        self._server.close()
        await self._server.wait_closed()


@pytest.mark.parametrize("retries", [0, 2])
async def test_the_profiles_broker_retries_bound_the_tries(tmp_path: Path, retries: int) -> None:
    config = RunnerConfig.model_validate(LoopSettings(broker_retries=retries).overrides())
    broker = Unreachable()
    async with broker as url, ScriptedModelServer() as model:
        # A tool call first: the run's first broker calls are not its output, whose own
        # tries ride out an outage whatever the profile says.
        model.script(
            [
                Reply.tool_calls([ToolCall("file_read", {"path": "a.txt"})]),
                Reply.text("an answer nobody receives"),
            ]
        )
        activation = spec(tmp_path).model_copy(update={"controller_url": url, "runner": config})
        env = {"SUZUMIO_MODEL_BASE_URL": f"{model.url}/v1"}
        code = await run_activation(activation, env)
    assert code == exits.BROKER_UNREACHABLE
    # Each call the run made (its first, the live stream's flush beside it) was tried as the
    # profile says, then it gave up: the output was never reached.
    assert set(broker.tries.values()) == {retries + 1}, broker.tries
    assert "/activation-output" not in broker.tries


def test_the_default_is_five_and_the_profile_may_not_ask_for_more_than_twenty() -> None:
    assert RunnerConfig().broker_retries == 5
    with pytest.raises(ValueError, match="less than or equal to 20"):
        LoopSettings(broker_retries=21)
