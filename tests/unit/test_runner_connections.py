"""A resident runner's kept HTTP clients carry no credential: each activation's broker client
sends its own token with every request, and closing it leaves the kept client open."""

from __future__ import annotations

import httpx

from suzumio.contracts.broker import StreamChunk
from suzumio.contracts.runner import RunnerActivationOutput
from suzumio.runner.broker import BrokerClient


async def test_activations_on_one_kept_client_send_their_own_tokens() -> None:
    seen: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"recorded": True})

    kept = httpx.AsyncClient(base_url="http://broker", transport=httpx.MockTransport(answer))
    first = BrokerClient("http://broker", "token-of-a", http=kept)
    await first.output(RunnerActivationOutput(text="a"))
    await first.aclose()
    assert not kept.is_closed  # the next activation's client still works
    second = BrokerClient("http://broker", "token-of-b", http=kept)
    await second.output(RunnerActivationOutput(text="b"))
    await second.stream([StreamChunk(kind="text", text="b")], batch=0)
    await second.aclose()
    await kept.aclose()

    assert seen == ["Bearer token-of-a", "Bearer token-of-b", "Bearer token-of-b"]
    assert "authorization" not in kept.headers


async def test_a_broker_client_of_its_own_is_closed_with_it() -> None:
    client = BrokerClient("http://broker", "token")
    await client.aclose()
    assert client._http.is_closed
