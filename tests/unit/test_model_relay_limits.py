"""The tool-broker's model relay calls a project's provider from the broker's place in the
network, not the sandbox's: a provider endpoint on a loopback, private or link-local address
(the platform's own servers, a cloud's metadata service) is refused unless the operator allows
it, and one sandbox may not hold the relay's connections from every other activation. The
upstream is the no-op model server (the one allowed fake); no name is resolved (addresses are
literals: no traffic leaves this host)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest
from fastapi.responses import StreamingResponse

from suzumio.testing.model_server import NoopModelServer
from suzumio.toolbroker.access import Caller
from suzumio.toolbroker.model_relay import MAX_CALLS_PER_ACTIVATION, ModelRelay, Upstream
from suzumio.toolbroker.problems import BrokerError


@pytest.mark.parametrize(
    ("url", "status", "said"),
    [
        ("http://127.0.0.1:4222/v1", 403, "loopback"),
        ("http://10.0.0.7/v1", 403, "private"),
        ("http://169.254.169.254/latest/meta-data", 403, "link-local"),
        ("http://[::ffff:192.168.1.1]/v1", 403, "private"),
        ("http://0.0.0.0:8080/v1", 403, "unspecified"),
        ("https://93.184.216.34/v1?x=", 403, "query"),
        ("https://93.184.216.34/v1#x", 403, "query"),
    ],
)
async def test_a_provider_on_a_private_address_is_not_called(
    url: str, status: int, said: str
) -> None:
    relay = ModelRelay(None, 10)
    with pytest.raises(BrokerError) as refused:
        await relay.check_provider(url, "internal")
    assert refused.value.status == status
    assert said in refused.value.detail
    assert "'internal'" in refused.value.detail


async def test_a_public_provider_is_called_and_the_operator_may_allow_private_ones() -> None:
    await ModelRelay(None, 10).check_provider("https://93.184.216.34/v1", "public")
    allowed = ModelRelay(None, 10, allow_private=True)
    await allowed.check_provider("http://127.0.0.1:11434/v1", "ollama-here")
    with pytest.raises(BrokerError):  # a query never: the relay's path would land in it
        await allowed.check_provider("http://127.0.0.1:11434/v1?to=elsewhere", "ollama-here")


def caller(activation_id: str) -> Caller:
    return cast("Caller", SimpleNamespace(claims=SimpleNamespace(activation_id=activation_id)))


async def test_one_activation_may_hold_only_a_few_relayed_calls_open() -> None:
    relay = ModelRelay(None, 10)
    async with NoopModelServer() as model:
        upstream = Upstream(f"{model.url}/v1", None)

        async def call(activation_id: str) -> StreamingResponse:
            body = b'{"model": "m", "stream": true, "messages": []}'
            answer = await relay.forward(upstream, body, caller(activation_id), "default")
            assert isinstance(answer, StreamingResponse)
            return answer

        async def read(answer: StreamingResponse) -> bytes:
            chunks = [chunk async for chunk in answer.body_iterator]
            return b"".join(c.encode() if isinstance(c, str) else bytes(c) for c in chunks)

        held = [await call("greedy") for _ in range(MAX_CALLS_PER_ACTIVATION)]
        with pytest.raises(BrokerError) as refused:
            await call("greedy")
        assert (refused.value.status, refused.value.headers) == (429, {"Retry-After": "1"})
        # Another activation's calls go on; and a call read to its end frees its place.
        assert b"data:" in await read(await call("other"))
        assert b"data:" in await read(held[0])
        for answer in (await call("greedy"), *held[1:]):
            assert b"data:" in await read(answer)
    assert model.calls == MAX_CALLS_PER_ACTIVATION + 2
