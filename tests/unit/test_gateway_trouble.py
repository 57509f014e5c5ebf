"""The gateway's answer to a JetStream API error reply (`jsapi.request` raises one for every
error the server sends back): the server's own trouble, or a stream not there yet (LIVE is made
again within seconds of a NATS restart that lost it), is a 503 to retry, with Retry-After — it
was a 500 `internal`, which the CLI takes as final; a request the server refused as ours is
still a 500."""

from __future__ import annotations

import httpx
import pytest
from asyncpg.exceptions import UndefinedTableError
from fastapi import FastAPI

from suzumio.gateway.api.problems import HANDLERS
from suzumio.platform.bus.direct_get import DirectGetError
from suzumio.platform.errors import JetStreamApiError


@pytest.mark.parametrize(
    ("code", "err_code", "status"),
    [(503, 10008, 503), (500, 10049, 503), (404, 10059, 503), (400, 10025, 500)],
    ids=["no_leader", "server", "stream_not_found", "bad_request"],
)
async def test_a_jetstream_error_reply_is_a_503_when_it_passes(
    code: int, err_code: int, status: int
) -> None:
    app = FastAPI(exception_handlers=HANDLERS)  # type: ignore[arg-type]

    @app.get("/thing")
    async def thing() -> None:
        raise JetStreamApiError(code, err_code, "told so")

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        answer = await c.get("/thing")
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    if status == 503:
        assert answer.headers["retry-after"] == "1"
        assert answer.json()["code"] == "unavailable"


@pytest.mark.parametrize(
    ("raised", "status"),
    [
        (DirectGetError(503), 503),  # no leader while a cluster elects one
        (DirectGetError(412), 503),  # a replica behind the floor asked for
        (DirectGetError(400), 500),
        # A read model's table not made yet: the projector makes them a moment after the
        # gateway is up, on a platform's first start (a fresh stack's first request got 500).
        (UndefinedTableError('relation "proj_users.api_keys" does not exist'), 503),
        (UndefinedTableError('relation "suzumio.nothing" does not exist'), 500),
    ],
    ids=["dg_503", "dg_412", "dg_400", "read_model_not_yet", "other_relation"],
)
async def test_a_read_that_may_pass_is_a_503(raised: Exception, status: int) -> None:
    app = FastAPI(exception_handlers=HANDLERS)  # type: ignore[arg-type]

    @app.get("/thing")
    async def thing() -> None:
        raise raised

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        answer = await c.get("/thing")
    assert answer.status_code == status, answer.text
