"""`POST /runner/credentials`: a provider's key as its project holds it now (DESIGN.md Appendix
A: 401 → refresh the credential, then fall back).

A sandbox gets its provider keys in its environment at launch; a key a user replaced while a
long activation ran (`PUT /v1/projects/{id}/providers/{name}`) never reaches it that way. When
the provider refuses the key it has, the runner asks here once for the current one.

What is answered, and to whom: only a provider of the token's own project, and only one that
the activation's agent calls a model through (its `model` or `fallbacks` as the log holds them
now, naming that model and that provider), and only while the provider still names the
endpoint the runner calls (a key set along with a new endpoint never goes to the old one);
never to an activation without network (its token says `keyless`: its models are called
through the relay, and no key may enter its sandbox); anything else — another agent's
provider, a name the project does not have, a model of the platform's default endpoint (its
key is the platform's own, which the broker does not hold) — is 404, alike. The key is
opened with the platform's secret key, never logged, and the answer says `Cache-Control:
no-store`. A runner looping on 401s cannot hammer it: one answer per activation and provider
per `credential_refresh_seconds` on a replica, 429 with Retry-After before that.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from fastapi import APIRouter, Response

from suzumio.contracts.broker import CredentialAnswer, CredentialRequest
from suzumio.platform.logging import get_logger
from suzumio.platform.secrets import SecretBox, SecretError
from suzumio.toolbroker.model_chain import model_chain, provider_of
from suzumio.toolbroker.problems import BrokerError
from suzumio.toolbroker.routes import Auth, Shared

log = get_logger(__name__)
router = APIRouter()
NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}


@dataclass
class CredentialDesk:
    """The platform's keys to open providers' keys with, and when each activation last had
    one of a provider (on this replica)."""

    box: SecretBox
    interval: float
    _last: OrderedDict[tuple[str, str], float] = field(default_factory=OrderedDict)

    def take(self, activation_id: str, provider: str, now: float | None = None) -> None:
        """Count one answer for `activation_id`'s `provider`, or 429 if it had one less than
        `interval` seconds ago."""
        now = time.monotonic() if now is None else now
        # Oldest first: what is past the interval bounds nothing any more (memory stays
        # bounded by the answers of the last `interval` seconds).
        while self._last and next(iter(self._last.values())) <= now - self.interval:
            self._last.popitem(last=False)
        key = (activation_id, provider)
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            wait = max(1, math.ceil(self.interval - (now - last)))
            raise BrokerError(
                429,
                "rate_limited",
                f"this activation had provider {provider!r}'s key {now - last:.0f} s ago: "
                f"at most one answer per {self.interval:g} s",
                headers={"Retry-After": str(wait)},
            )
        self._last[key] = now
        self._last.move_to_end(key)


@router.post("/runner/credentials")
async def credential(
    body: CredentialRequest, caller: Auth, broker: Shared, response: Response
) -> CredentialAnswer:
    """The current key of the provider `body.model` of the caller's agent is called through."""
    response.headers.update(NO_STORE)
    if caller.claims.keyless:
        # Its sandbox has no network, and so no key: the relay calls its models with the key
        # the project holds at each call. Answered here, a key would be in reach of whatever
        # runs in the sandbox, with ways out (its files, its messages) but no network.
        raise _missing(
            "this activation calls its models through the broker's relay: no key goes into "
            "its sandbox"
        )
    desk = broker.credentials
    if body.provider is None:
        raise _missing(
            "a model without a provider is called through the platform's default endpoint, "
            "whose key the broker cannot refresh"
        )
    if desk is None:
        raise _missing("this broker cannot open provider keys (no usable secret key)")
    chain = await model_chain(broker, caller)
    if not any(m.name == body.model and m.provider == body.provider for m in chain):
        raise _missing(
            f"the activation's agent calls no model {body.model!r} through provider "
            f"{body.provider!r}"
        )
    desk.take(caller.claims.activation_id, body.provider)
    provider = await provider_of(broker, caller.claims.project_id, body.provider)
    if provider is None or provider.api_key is None:
        raise _missing(f"the project has no key for provider {body.provider!r}")
    if provider.base_url != body.base_url:
        # Moved to another endpoint since the launch: its new key is for the new endpoint, and
        # the old one (which may be the very one refusing, to harvest keys) never gets it.
        raise _missing(
            f"provider {body.provider!r} names another endpoint than the one the runner calls"
        )
    try:
        api_key = desk.box.open(provider.api_key)
    except SecretError as exc:
        log.warning("credentials.unopenable", provider=body.provider, error=str(exc))
        raise _missing(f"provider {body.provider!r}: {exc}") from None
    if not api_key:  # a key stored empty is no key
        raise _missing(f"the project has no key for provider {body.provider!r}")
    log.info(
        "credentials.answered",
        activation=caller.claims.activation_id,
        provider=body.provider,
        key_id=provider.api_key.key_id,  # which platform key sealed it; never the key
    )
    return CredentialAnswer(provider=body.provider, api_key=api_key)


def _missing(detail: str) -> BrokerError:
    return BrokerError(404, "not_found", detail)
