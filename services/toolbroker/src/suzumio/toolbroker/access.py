"""Who is calling: the token, checked, and the activation it names, still live.

401 when the token is missing, forged, malformed or expired; 403 when it is valid but its
activation may no longer act (cancelled, replaced by a P0, ended) or is not one the platform
requested. Nothing a refused call asked for happens.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.tokens import ActivationClaims, TokenError, TokenSigner
from suzumio.toolbroker.problems import BrokerError
from suzumio.toolbroker.registry import ActivationRegistry, LiveActivation
from suzumio.toolbroker.signed_first import CLAIMS_KEY


@dataclass(frozen=True)
class Caller:
    claims: ActivationClaims
    activation: LiveActivation

    @property
    def actor(self) -> str:
        return "system:toolbroker"


class Gate:
    def __init__(
        self, signer: TokenSigner, registry: ActivationRegistry, store: EventStore
    ) -> None:
        self._signer = signer
        self._registry = registry
        self._store = store

    async def check(self, request: Request, *, fenced_ok: bool = False) -> Caller:
        """The caller, if it may act. `fenced_ok`: a fenced activation's call is let through
        for its route to answer (an output sent again after its answer was lost: recorded
        before the fence, it is no refusal)."""
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise BrokerError(401, "unauthenticated", "an activation token is required")
        claims = request.scope.get(CLAIMS_KEY)  # `SignedFirst` checked this request's token
        if not isinstance(claims, ActivationClaims):
            try:
                claims = self._signer.verify(token.strip())
            except TokenError as exc:
                raise BrokerError(401, "unauthenticated", f"invalid token: {exc}") from None
        await self._fold(claims.session_id)
        activation = self._registry.get(claims.activation_id)
        if activation is None:
            await self._registry.recall(self._store, claims.activation_id, claims.session_id)
            activation = self._registry.get(claims.activation_id)
        if activation is None:
            raise BrokerError(403, "forbidden", "the activation was never requested")
        if (
            activation.session_id != claims.session_id
            or activation.agent_id != claims.agent_id
            or (activation.project_id not in {None, claims.project_id})
        ):
            raise BrokerError(403, "forbidden", "the token does not match its activation")
        if not fenced_ok:
            _unfenced(activation)
        return Caller(claims, activation)

    async def still_live(self, caller: Caller) -> None:
        """Check the fence again for a call that took long after it was let in (an upload
        whose body is still arriving): a cancel stored meanwhile must stop its effect."""
        await self._fold(caller.claims.session_id)
        _unfenced(caller.activation)

    async def _fold(self, session_id: str) -> None:
        # A cancel stored before this moment must be seen: fold up to now first.
        if not await self._registry.fresh(self._store, session_id):
            raise BrokerError(503, "unavailable", "the broker is catching up with the log")


def _unfenced(activation: LiveActivation) -> None:
    if activation.fenced:
        raise BrokerError(403, "fenced", f"the activation is {activation.fenced}")
    if activation.output:
        # Its work is done and said: its runner calls nothing after its output (its files go
        # before it). A call now is a process it left behind (a background job of a shell
        # command, with the token it read), which wrote to the session until the activation's
        # end was stored.
        raise BrokerError(403, "fenced", "the activation has recorded its output")
