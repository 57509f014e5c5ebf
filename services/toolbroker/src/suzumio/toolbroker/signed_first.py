"""The token's signature checked before a request's body is read.

FastAPI reads and parses a route's whole JSON body before any dependency runs, the token's
check (`access.Gate`) included: anyone who reached the broker could make it parse tens of
megabytes — seconds of its event loop, hundreds of MB of memory — for a 401. A request that
may carry a body gets its bearer token's signature and expiry checked here first; one without
a good token is answered 401 with nothing of its body read. A declared body within
`DRAIN_BYTES` is thrown away by the HTTP server on a connection that stays open, so a client
that writes its whole body before it reads gets the answer (closed with bytes unread, the
kernel would reset the connection and drop it); a longer or streamed one is answered with
`Connection: close`. The claims go on in the request's scope, for the gate not to check them
twice.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from suzumio.platform.service.bodylimit import DRAIN_BYTES, content_length, send_problem
from suzumio.platform.tokens import ActivationClaims, TokenError, TokenSigner

CLAIMS_KEY = "suzumio.claims"
"""Where the verified claims of the request's token are in its ASGI scope."""
_BODILESS = frozenset({"GET", "HEAD", "OPTIONS"})


class SignedFirst:
    """ASGI middleware: requests that may carry a body need a good activation token."""

    def __init__(self, app: ASGIApp, signer: TokenSigner) -> None:
        self.app = app
        self._signer = signer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in _BODILESS:
            await self.app(scope, receive, send)
            return
        claims = self._claims(scope)
        if isinstance(claims, str):
            await _unauthenticated(send, claims, close=not _drainable(scope))
            return
        scope[CLAIMS_KEY] = claims
        await self.app(scope, receive, send)

    def _claims(self, scope: Scope) -> ActivationClaims | str:
        """The token's claims, or why there are none."""
        header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        scheme, _, token = header.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return "an activation token is required"
        try:
            return self._signer.verify(token.strip())
        except TokenError as exc:
            return f"invalid token: {exc}"


def _drainable(scope: Scope) -> bool:
    """Whether the request declares a body short enough to be read and thrown away."""
    declared = content_length(scope)
    return declared is not None and declared <= DRAIN_BYTES


async def _unauthenticated(send: Send, detail: str, *, close: bool) -> None:
    challenge = ((b"www-authenticate", b"Bearer"),)
    await send_problem(
        send, 401, "unauthenticated", "unauthenticated", detail, close=close, headers=challenge
    )
