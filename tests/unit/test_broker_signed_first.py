"""The tool-broker checks a request's token before anything reads its body: FastAPI parses a
route's whole JSON body before the gate runs, and anyone who reached the broker made it parse
tens of megabytes (seconds of its loop, hundreds of MB) for a 401."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from suzumio.contracts.ids import new_id
from suzumio.platform.tokens import ActivationClaims, TokenSigner
from suzumio.toolbroker.signed_first import CLAIMS_KEY, SignedFirst

KEY = "k" * 32


class Inner:
    """The broker's app: notes each request it got, reading its whole body."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.scopes.append(scope)
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


async def call(
    app: Any, method: str, token: str | None, body: bytes = b""
) -> tuple[int, bytes, int]:
    """The answer's status and body, and how many chunks of the request's body were read."""
    read = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal read
        read += 1
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"content-length", str(len(body)).encode())]
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    scope = {"type": "http", "method": method, "path": "/runner/signals", "headers": headers}
    await app(scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:]), read


def token(signer: TokenSigner, ttl: timedelta = timedelta(minutes=5)) -> str:
    return signer.issue(
        activation_id=new_id(), session_id=new_id(), project_id=new_id(), agent_id=new_id(),
        toolpacks=(), ttl=ttl,
    )  # fmt: skip


async def test_a_body_without_a_good_token_is_never_read() -> None:
    inner = Inner()
    app = SignedFirst(inner, TokenSigner([KEY]))
    big = b'{"received": [' + b"[]," * 1_000_000 + b"[]]}"
    forged = token(TokenSigner(["x" * 32]))
    expired = token(TokenSigner([KEY]), ttl=timedelta(seconds=-1))
    for method, sent in (("POST", None), ("POST", forged), ("PUT", expired), ("POST", "junk")):
        status, body, read = await call(app, method, sent, big)
        problem = json.loads(body)
        assert (status, problem["code"], read) == (401, "unauthenticated", 0), (method, sent)
    assert inner.scopes == []


async def test_a_good_token_goes_on_with_its_claims_and_reads_need_none() -> None:
    inner = Inner()
    signer = TokenSigner([KEY])
    app = SignedFirst(inner, signer)
    good = token(signer)
    status, _, read = await call(app, "POST", good, b'{"received": []}')
    assert (status, read) == (200, 1)
    claims = inner.scopes[0][CLAIMS_KEY]
    assert isinstance(claims, ActivationClaims)
    assert claims == signer.verify(good)
    status, _, _ = await call(app, "GET", None)  # health, and reads: the gate checks those
    assert status == 200
    assert CLAIMS_KEY not in inner.scopes[1]
