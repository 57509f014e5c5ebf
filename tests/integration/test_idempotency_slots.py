"""The gateway's Idempotency-Key layer on a real NATS KV bucket, around a stand-in route that
counts its runs: a request that runs long keeps its slot (its retry is told it is in progress,
not run a second time) — even when a renewal of its claim landed but its answer was lost (the
bucket's first update here says it timed out) — and a 404 is not kept (nothing ran; it may be
the read models' lag, and kept, every retry would get it for a day)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import httpx
import pytest
from nats.aio.client import Client as NATS
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.kv import KeyValue
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from suzumio.contracts.subjects import Topology
from suzumio.gateway.api import idempotency
from suzumio.gateway.api.idempotency import IdempotencyMiddleware
from suzumio.platform.bus.kv import ensure_kv
from suzumio.platform.secrets import SecretBox


class CountingRoute:
    def __init__(self) -> None:
        self.runs = 0
        self.seconds = 0.0
        self.statuses = [201]

    async def endpoint(self, request: Request) -> JSONResponse:
        self.runs += 1
        await request.body()
        await asyncio.sleep(self.seconds)
        status = self.statuses[min(self.runs, len(self.statuses)) - 1]
        return JSONResponse({"run": self.runs}, status_code=status)


async def _valid(_: str) -> bool:
    return True


def _client(
    kv: object,
    route: CountingRoute,
    key: str,
    valid: Callable[[str], Awaitable[bool | None]] = _valid,
) -> httpx.AsyncClient:
    """A client of the layer around `route` on `kv`, with Idempotency-Key `key`."""
    box = SecretBox([SecretBox.generate_key()])
    app = IdempotencyMiddleware(
        Starlette(routes=[Route("/things", route.endpoint, methods=["POST"])]),
        lambda: cast("KeyValue", kv),
        lambda: box,
        valid,
    )
    headers = {"Authorization": "Bearer caller", "Idempotency-Key": key}
    transport = httpx.ASGITransport(app=app)
    return httpx.AsyncClient(transport=transport, base_url="http://gw", headers=headers)


class LosingKV:
    """The bucket, but the first update it is asked for lands and then its answer is lost
    (a publish timed out as a stream leader moved)."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv
        self.lost = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kv, name)

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        revision = await self._kv.update(key, value, last=last)
        if self.lost == 0:
            self.lost += 1
            raise NatsTimeoutError
        return revision


@pytest.fixture
async def kv(nc: NATS, topology: Topology) -> LosingKV:
    return LosingKV(await ensure_kv(nc.jetstream(), topology.bucket("idempotency"), ttl=600))


@pytest.fixture
async def route_and_client(
    kv: LosingKV,
) -> AsyncIterator[tuple[CountingRoute, httpx.AsyncClient]]:
    route = CountingRoute()
    async with _client(kv, route, "k1") as c:
        yield route, c


async def test_a_request_running_past_the_stale_limit_keeps_its_slot(
    route_and_client: tuple[CountingRoute, httpx.AsyncClient],
    kv: LosingKV,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, a request still running after 60 s was taken for dead: its retry took the slot
    over and ran it again, and the later answer overwrote the first."""
    monkeypatch.setattr(idempotency, "STALE_PENDING_SECONDS", 0.9)
    route, c = route_and_client
    route.seconds = 2.0
    first = asyncio.create_task(c.post("/things", json={"a": 1}))
    await asyncio.sleep(1.4)  # past the stale limit, the first still running
    retried = await c.post("/things", json={"a": 1})
    assert retried.status_code == 409
    assert "still in progress" in retried.json()["detail"]
    answered = await first
    assert (answered.status_code, answered.json()) == (201, {"run": 1})
    replayed = await c.post("/things", json={"a": 1})
    assert (replayed.status_code, replayed.json()) == (201, {"run": 1})
    assert replayed.headers.get("idempotent-replayed") == "true"
    assert route.runs == 1
    assert kv.lost == 1  # a renewal's answer was lost on the way


async def test_a_404_is_not_kept(route_and_client: tuple[CountingRoute, httpx.AsyncClient]) -> None:
    route, c = route_and_client
    route.statuses = [404, 201]
    assert (await c.post("/things", json={"a": 1})).status_code == 404
    again = await c.post("/things", json={"a": 1})
    assert (again.status_code, again.json()) == (201, {"run": 2})


class DownKV:
    """The bucket while NATS is away: every call times out."""

    def __getattr__(self, name: str) -> Any:
        async def timed_out(*_: Any, **__: Any) -> Any:
            raise NatsTimeoutError

        return timed_out


async def test_the_bucket_out_of_reach_is_a_503_to_retry_not_a_500() -> None:
    """The slot is taken before the route runs, outside the routes' error handlers: NATS
    reconnecting there was answered 500 `internal` (do not retry) with a traceback, for a
    request that was fine — to a careful client, the one that sends Idempotency-Key."""
    route = CountingRoute()
    app = IdempotencyMiddleware(
        Starlette(routes=[Route("/things", route.endpoint, methods=["POST"])]),
        lambda: cast("KeyValue", DownKV()),
        lambda: SecretBox([SecretBox.generate_key()]),
        _valid,
    )
    headers = {"Authorization": "Bearer caller", "Idempotency-Key": "k1"}
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw", headers=headers) as c:
        answer = await c.post("/things", json={"a": 1})
    assert answer.status_code == 503, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.headers["retry-after"] == "1"
    assert answer.json()["code"] == "unavailable"
    assert route.runs == 0


class LandedKV(LosingKV):
    """The bucket, but the first create lands and then its answer is lost."""

    async def create(self, key: str, value: bytes) -> int:
        revision = await self._kv.create(key, value)
        if self.lost == 0:
            self.lost += 1
            raise NatsTimeoutError
        return revision


async def test_a_slot_taken_though_its_answer_was_lost_is_freed_for_the_retry(
    nc: NATS, topology: Topology
) -> None:
    """The 503's retry, with the same key, was told for a minute that the request was still
    in progress (its pending record, written as the answer was lost), while nothing had run."""
    kv = LandedKV(await ensure_kv(nc.jetstream(), topology.bucket("idempotency"), ttl=600))
    route = CountingRoute()
    async with _client(kv, route, "k-landed") as c:
        first = await c.post("/things", json={"a": 1})
        assert (first.status_code, kv.lost, route.runs) == (503, 1, 0)
        retried = await c.post("/things", json={"a": 1})
    assert (retried.status_code, retried.json()) == (201, {"run": 1})


async def test_a_kept_answer_is_replayed_only_to_a_key_that_can_be_told_valid(
    kv: LosingKV,
) -> None:
    """A kept answer goes only to a key that still opens the API: a revoked one gets 401,
    and one that cannot be checked now (the keys' read model frozen and the log not
    answering) a 503 to retry — never the answer, and the route never runs again."""
    route = CountingRoute()
    validity: list[bool | None] = [True]

    async def valid(_: str) -> bool | None:
        return validity[0]

    async with _client(kv, route, "k-valid", valid) as c:
        assert (await c.post("/things", json={"a": 1})).status_code == 201
        validity[0] = None
        unknown = await c.post("/things", json={"a": 1})
        assert unknown.status_code == 503
        assert unknown.headers["retry-after"] == "1"
        validity[0] = False
        assert (await c.post("/things", json={"a": 1})).status_code == 401
        validity[0] = True
        replayed = await c.post("/things", json={"a": 1})
    assert (replayed.status_code, replayed.json()) == (201, {"run": 1})
    assert route.runs == 1
