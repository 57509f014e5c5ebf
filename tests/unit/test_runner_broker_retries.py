"""How often a runner tries a broker it cannot reach is the runtime profile's (`loop.
broker_retries`, into the input's `runner.broker_retries`): the whole run, against a listener
that takes each connection and closes it at once, and a scripted model that answers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from suzumio.contracts.runner import RunnerConfig
from suzumio.contracts.values import LoopSettings
from suzumio.runner import exits
from suzumio.runner.main import run_activation
from suzumio.testing.model_server import Reply, ScriptedModelServer
from tests.unit.loop_support import spec


class Unreachable:
    """A port that takes connections and drops them: a transport error for every request."""

    def __init__(self) -> None:
        self.connections = 0

    async def __aenter__(self) -> str:
        async def drop(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
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
        model.script([Reply.text("an answer nobody receives")])
        activation = spec(tmp_path).model_copy(update={"controller_url": url, "runner": config})
        env = {"SUZUMIO_MODEL_BASE_URL": f"{model.url}/v1"}
        code = await run_activation(activation, env)
    assert code == exits.BROKER_UNREACHABLE
    assert broker.connections == retries + 1  # the first call's tries, then it gave up


def test_the_default_is_five_and_the_profile_may_not_ask_for_more_than_twenty() -> None:
    assert RunnerConfig().broker_retries == 5
    with pytest.raises(ValueError, match="less than or equal to 20"):
        LoopSettings(broker_retries=21)
