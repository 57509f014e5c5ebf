"""The runner's broker client: a resident runner's kept HTTP clients carry no credential (each
activation's broker client sends its own token with every request, and closing it leaves the
kept client open); the final call falls back to separate calls on a broker older than it, and
a refused one fails the activation, saying why. The broker here is an `httpx.MockTransport`:
these are the client's own decisions."""

from __future__ import annotations

import json

import httpx
import pytest

from suzumio.contracts.broker import HistoryEntryIn, StreamBatch, StreamChunk
from suzumio.contracts.runner import RunnerActivationOutput
from suzumio.runner import exits
from suzumio.runner.agent import Ending
from suzumio.runner.broker import BrokerClient, FencedError
from suzumio.runner.main import final_call


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


async def test_a_broker_older_than_the_final_call_gets_its_parts_one_by_one() -> None:
    """Such a broker takes `/activation-output` as schema 1 only, and answers a 2 with a 422:
    the batch, the entry and the output then go apart, in that order — nothing is lost."""
    calls: list[tuple[str, dict[str, object]]] = []

    def old_broker(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        calls.append((request.url.path, body))
        if body.get("schema_version", 1) != 1:
            return httpx.Response(422, json={"detail": "schema_version: Input should be 1"})
        return httpx.Response(200, json={"recorded": True})

    http = httpx.AsyncClient(base_url="http://broker", transport=httpx.MockTransport(old_broker))
    client = BrokerClient("http://broker", "token", http=http)
    entry = HistoryEntryIn(message_id="e" * 26, role="assistant", text="done")
    batch = StreamBatch(chunks=(StreamChunk(kind="text", text="do"),), batch=3)
    await client.output(RunnerActivationOutput(text="done"), [entry], batch)
    await http.aclose()

    assert [path for path, _ in calls] == [
        "/activation-output",  # refused
        "/runner/stream",
        "/runner/history",
        "/activation-output",
    ]
    assert calls[1][1]["batch"] == 3  # numbered as it was: published once
    assert calls[2][1]["entries"][0]["message_id"] == "e" * 26  # type: ignore[index]
    assert calls[3][1] == {"schema_version": 1, "text": "done", "usage": {}, "reason": "completed"}


async def test_a_refused_final_call_fails_the_activation_and_says_why() -> None:
    """A refusal of the final call (here a 409 on its history entry) is handled as a refused
    call inside the loop: the output says the activation failed and why, and the runner exits
    as crashed; a fence is not answered at all."""
    outputs: list[dict[str, object]] = []

    def broker(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if body.get("history"):
            return httpx.Response(409, json={"detail": "the entry conflicts"})
        outputs.append(body)
        return httpx.Response(200, json={"recorded": True})

    http = httpx.AsyncClient(base_url="http://broker", transport=httpx.MockTransport(broker))
    client = BrokerClient("http://broker", "token", http=http)
    entry = HistoryEntryIn(message_id="e" * 26, role="assistant", text="done")
    ending = Ending("completed", "done", {"model_calls": 1}, history=(entry,))
    assert await final_call(client, ending, None, exits.COMPLETED) == exits.CRASHED
    assert len(outputs) == 1
    assert outputs[0]["reason"] == "failed"
    assert "the entry conflicts" in str(outputs[0]["text"])
    assert outputs[0]["usage"] == {"model_calls": 1}

    fenced = BrokerClient(
        "http://broker",
        "token",
        http=httpx.AsyncClient(
            base_url="http://broker",
            transport=httpx.MockTransport(lambda _: httpx.Response(403, json={"detail": "x"})),
        ),
    )
    with pytest.raises(FencedError):
        await final_call(fenced, ending, None, exits.COMPLETED)
    await http.aclose()
