"""Activation tokens across releases: a token carries only the claims that differ from their
defaults, so a tool-broker of an earlier release (whose claims refuse fields they do not
know) still reads an ordinary token an upgraded orchestrator signed — and refuses a `keyless`
one, which it could not honour (the safe side)."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta

import pytest
from pydantic import BaseModel, ConfigDict

from suzumio.platform.secrets import SecretBox
from suzumio.platform.tokens import TokenSigner


class EarlierClaims(BaseModel):
    """The claims as a release before `keyless` had them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    activation_id: str
    session_id: str
    project_id: str
    agent_id: str
    toolpacks: tuple[str, ...] = ()
    expires_at: datetime


def claims_of(token: str) -> dict[str, object]:
    body = token.split(".")[1]
    decoded: dict[str, object] = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    return decoded


def issue(signer: TokenSigner, *, keyless: bool) -> str:
    return signer.issue(
        activation_id="a1", session_id="s1", project_id="p1", agent_id="g1",
        ttl=timedelta(minutes=5), keyless=keyless,
    )  # fmt: skip


def test_an_ordinary_token_reads_in_an_earlier_release_and_a_keyless_one_does_not() -> None:
    signer = TokenSigner([SecretBox.generate_key()])
    ordinary, keyless = issue(signer, keyless=False), issue(signer, keyless=True)
    assert "keyless" not in claims_of(ordinary)
    assert "policies" not in claims_of(ordinary)  # an agent whose tools are all allowed
    EarlierClaims.model_validate(claims_of(ordinary))
    with pytest.raises(ValueError, match="keyless"):
        EarlierClaims.model_validate(claims_of(keyless))
    assert signer.verify(keyless).keyless
    assert not signer.verify(ordinary).keyless
