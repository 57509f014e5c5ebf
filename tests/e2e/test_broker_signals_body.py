"""`POST /runner/signals`: the signals an activation received travel in a body. In the query
string of `GET /runner/signals` they outgrew a URL — httpx refuses one past ~3,000 ids (the
runner ended with exit 1 and no output), an h11 server's request head ~350 — so a long-lived
activation in a busy session could not take its next signals."""

from __future__ import annotations

import json

import httpx

from suzumio.contracts.ids import new_id
from suzumio.runner.broker import MAX_RECEIVED_IN_URL, BrokerClient
from tests.e2e.stack import Stack
from tests.e2e.test_broker_access import broker, live


async def test_a_runner_that_received_thousands_of_signals_still_takes_the_next(
    platform: Stack,
) -> None:
    a = await live(platform, "sigbody")
    client = BrokerClient(platform.url_of("toolbroker"), a.token, retries=0)
    try:
        assert await client.signals([new_id() for _ in range(5_000)]) == ()
    finally:
        await client.aclose()
    async with broker(platform, a.token) as c:
        bad = await c.post("/runner/signals", json={"received": ["not an id"]})
        many = await c.post("/runner/signals", json={"received": [new_id()] * 10_001})
        # Past what the largest valid list takes: refused before it is read, not parsed.
        padded = b'{"received": []' + b" " * 2_000_000 + b"}"
        huge = await c.post("/runner/signals", content=padded)
    assert bad.status_code == 422, bad.text
    assert bad.headers["content-type"] == "application/problem+json"
    assert many.status_code == 422, many.text
    assert huge.status_code == 413, huge.text


async def test_against_a_broker_from_before_the_post_the_newest_go_in_the_query() -> None:
    """Such a broker answers the POST 405; the runner asks again the old way, naming as many
    of the newest as a URL holds (the loop drops a signal handed over again)."""
    asked: list[httpx.Request] = []

    def old_broker(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        if request.method == "POST":
            return httpx.Response(405, json={"detail": "Method Not Allowed"})
        return httpx.Response(200, json={"signals": []})

    client = BrokerClient(
        "http://broker", "token", retries=0, transport=httpx.MockTransport(old_broker)
    )
    received = [new_id() for _ in range(1_000)]
    try:
        assert await client.signals(received) == ()
    finally:
        await client.aclose()
    post, get = asked
    assert json.loads(post.content) == {"received": received}
    assert get.url.params.get_list("received") == received[-MAX_RECEIVED_IN_URL:]
