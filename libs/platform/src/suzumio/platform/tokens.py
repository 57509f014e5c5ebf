"""Activation tokens: what a sandbox shows the tool-broker (DESIGN.md §7, §10).

A token names one activation (with its session, project, agent and toolpacks) and an expiry,
and is signed with HMAC-SHA256 under a key derived from the platform's secret key, so any
broker replica can check it without a lookup. Revocation (fencing) is not in the token: the
broker refuses a valid token whose activation is no longer live.

Form: `sza1.<claims, base64url JSON>.<signature, base64url>`. With several secret keys
configured, the first signs and all verify, so keys roll like the sealed secrets do.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import ToolPolicy

PREFIX = "sza1"
_CONTEXT = b"suzumio activation token v1"
MAX_TOKEN_BYTES = 8_192


class TokenError(Exception):
    """The token is malformed, forged or expired (HTTP 401)."""


class ActivationClaims(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    activation_id: Identifier
    session_id: Identifier
    project_id: Identifier
    agent_id: Identifier
    toolpacks: tuple[str, ...] = ()
    expires_at: datetime = Field(description="UTC instant after which the token is void")
    keyless: bool = Field(
        default=False,
        description="its sandbox holds no provider key (network `none`: the broker's relay "
        "calls its models), and the broker gives it none",
    )
    policies: dict[str, ToolPolicy] = Field(
        default_factory=dict,
        description="the agent's policy for the tools whose effect the broker makes "
        "(`suzumio.contracts.policies.BROKER_TOOLS`), where it is not `allow`",
    )


def _derive(key: str) -> bytes:
    # Its own key: a token's signature must never be usable as anything the secret key signs.
    return hmac.new(key.encode(), _CONTEXT, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenSigner:
    def __init__(self, secret_keys: Sequence[str]) -> None:
        if not secret_keys:
            raise ValueError("no secret key configured")
        self._keys = [_derive(k) for k in secret_keys]

    def issue(
        self,
        *,
        activation_id: str,
        session_id: str,
        project_id: str,
        agent_id: str,
        toolpacks: Sequence[str] = (),
        ttl: timedelta,
        now: datetime | None = None,
        keyless: bool = False,
        policies: Mapping[str, ToolPolicy] | None = None,
    ) -> str:
        claims = ActivationClaims(
            activation_id=activation_id,
            session_id=session_id,
            project_id=project_id,
            agent_id=agent_id,
            toolpacks=tuple(toolpacks),
            expires_at=(now or datetime.now(UTC)) + ttl,
            keyless=keyless,
            policies=dict(policies or {}),
        )
        # Fields at their defaults are left out: a token a broker of an earlier release reads
        # (its claims refuse fields they do not know) as long as it needs nothing new — a
        # `keyless` one it refuses, the safe side.
        body = _b64(claims.model_dump_json(exclude_defaults=True).encode())
        return f"{PREFIX}.{body}.{self._sign(self._keys[0], body)}"

    def verify(self, token: str, now: datetime | None = None) -> ActivationClaims:
        if len(token) > MAX_TOKEN_BYTES:
            raise TokenError("token too long")
        prefix, _, rest = token.partition(".")
        body, _, signature = rest.partition(".")
        if prefix != PREFIX or not body or not signature:
            raise TokenError("not an activation token")
        if not token.isascii():
            raise TokenError("not an activation token")
        if not any(hmac.compare_digest(self._sign(key, body), signature) for key in self._keys):
            raise TokenError("bad signature")
        try:
            claims = ActivationClaims.model_validate_json(_unb64(body))
        except (ValueError, ValidationError) as exc:
            raise TokenError("unreadable claims") from exc
        if (now or datetime.now(UTC)) >= claims.expires_at:
            raise TokenError("token expired")
        return claims

    @staticmethod
    def _sign(key: bytes, body: str) -> str:
        return _b64(hmac.digest(key, body.encode(), "sha256"))  # one C call, no HMAC object
