"""A broker that answers 5xx (NATS briefly gone behind it) refused nothing: the runner retries,
and when the retries run out it gives up with `BrokerUnavailableError` — never taking the 5xx
for a refusal, so the final call never swaps the real output for a stand-in that says the
activation failed. Only a 4xx is a refusal. The broker is an `httpx.MockTransport`: these are
the client's own decisions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from suzumio.contracts.broker import HistoryEntryIn
from suzumio.runner import exits
from suzumio.runner.agent import Ending
from suzumio.runner.broker import BrokerClient, BrokerError, BrokerUnavailableError
from suzumio.runner.main import final_call
from suzumio.testing.model_server import Reply
from suzumio.testing.model_server import ToolCall as ModelToolCall
from tests.unit.loop_support import Broker as LoopBroker
from tests.unit.loop_support import run_loop, spec

ENTRY = HistoryEntryIn(message_id="e" * 26, role="assistant", text="the real answer")
ENDING = Ending("completed", "the real answer", {"model_calls": 1}, history=(ENTRY,))


class Broker:
    """Answers each request with the next status of `statuses` (then 200)."""

    def __init__(self, *statuses: int) -> None:
        self.statuses = list(statuses)
        self.bodies: list[dict[str, Any]] = []

    def answer(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.content))
        status = self.statuses.pop(0) if self.statuses else 200
        if status >= 400:
            return httpx.Response(
                status,
                json={"status": status, "code": "unavailable", "detail": "NATS timed out"},
                headers={"Retry-After": "0"},
            )
        return httpx.Response(200, json={"recorded": True})

    def client(self, **kw: Any) -> BrokerClient:
        http = httpx.AsyncClient(
            base_url="http://broker", transport=httpx.MockTransport(self.answer)
        )
        return BrokerClient("http://broker", "token", http=http, **kw)


def real(body: dict[str, Any]) -> bool:
    return (body["text"], body["reason"]) == ("the real answer", "completed")


async def test_the_final_call_rides_out_5xx_and_records_the_real_output() -> None:
    """More 5xx than an ordinary call would take, fewer than the output's own retries."""
    broker = Broker(500, 503, 503)
    client = broker.client(retries=1, output_retries=3)
    assert await final_call(client, ENDING, None, exits.COMPLETED) == exits.COMPLETED
    assert len(broker.bodies) == 4
    assert all(real(b) for b in broker.bodies)  # each try the same: no stand-in
    assert broker.bodies[-1]["history"] == [ENTRY.model_dump(mode="json")]


async def test_a_broker_that_stays_unavailable_is_not_taken_for_a_refusal() -> None:
    broker = Broker(503, 503, 503, 503)
    client = broker.client(retries=1, output_retries=1)
    with pytest.raises(BrokerUnavailableError):
        await final_call(client, ENDING, None, exits.COMPLETED)
    assert len(broker.bodies) == 2
    assert all(real(b) for b in broker.bodies)  # never "failed" with no history


@pytest.mark.parametrize(("status", "raised"), [(500, BrokerUnavailableError), (422, BrokerError)])
async def test_any_call_after_its_retries_says_unavailable_and_a_4xx_says_refused(
    status: int, raised: type[Exception]
) -> None:
    broker = Broker(status, status, status)
    client = broker.client(retries=2)
    with pytest.raises(raised) as caught:
        await client.append_history([ENTRY])
    assert not (status >= 500 and isinstance(caught.value, BrokerError))
    assert len(broker.bodies) == (3 if status >= 500 else 1)


async def test_the_final_call_rides_out_a_broker_it_cannot_reach_even_with_no_retries() -> None:
    """A profile's `broker_retries: 0` gave the output no try after a dropped connection:
    the real answer was lost and the attempt done again. Its tries stay the output's own."""
    failures = 3
    bodies: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        nonlocal failures
        if failures > 0:
            failures -= 1
            raise httpx.ConnectError("connection refused", request=request)
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"recorded": True})

    http = httpx.AsyncClient(base_url="http://broker", transport=httpx.MockTransport(answer))
    client = BrokerClient("http://broker", "token", http=http, retries=0, output_retries=1)
    try:
        assert await final_call(client, ENDING, None, exits.COMPLETED) == exits.COMPLETED
        failures = 1
        with pytest.raises(BrokerUnavailableError):  # any other call: the profile's none
            await client.append_history([ENTRY])
    finally:
        await http.aclose()
    assert [real(b) for b in bodies] == [True]


class SupportUnavailable(LoopBroker):
    """A broker that answers every core tool's call 503 (it may have applied it, its answers
    lost), and all the rest."""

    def answer(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/support"):
            return httpx.Response(
                503,
                json={"status": 503, "code": "unavailable", "detail": "NATS timed out"},
                headers={"Retry-After": "0"},
            )
        return super().answer(request)


async def test_a_call_the_broker_could_not_answer_is_recorded_as_of_unknown_outcome(
    tmp_path: Path,
) -> None:
    """Recorded as "failed", the next attempt's model read the message as not sent, and sent
    it again (the broker may have applied it)."""
    broker = SupportUnavailable()
    send = ModelToolCall("message_send", {"session_id": "s" * 26, "text": "deploy done"})
    with pytest.raises(BrokerUnavailableError):
        await run_loop(tmp_path, spec(tmp_path), [Reply.tool_calls([send])], broker, retries=0)
    [result] = broker.tool_results()
    assert result["text"].startswith("tool call outcome unknown:")
    assert "may have taken effect" in result["text"]
