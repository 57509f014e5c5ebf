"""The runner's log never holds its activation's secrets (the token, the provider keys of its
environment), whatever a line carries: a failed activation's log tail goes into its events."""

from __future__ import annotations

import json

import pytest

from suzumio.runner import log as runner_log

TOKEN = "sza1.activation-token-value.signature-part"
PROVIDER_KEY = "provider-key-0123456789"


@pytest.fixture(autouse=True)
def no_secrets_kept() -> None:
    runner_log.secrets.clear()


def test_a_kept_secret_never_reaches_the_log(capsys: pytest.CaptureFixture[str]) -> None:
    runner_log.keep_secret(TOKEN, PROVIDER_KEY, "none")
    runner_log.log(
        "model.failed", error=f"401 for key {PROVIDER_KEY}", nested={"t": TOKEN}, word="none"
    )
    line = capsys.readouterr().err
    assert TOKEN not in line
    assert PROVIDER_KEY not in line
    record = json.loads(line)
    assert record["error"] == "401 for key [redacted]"
    assert record["word"] == "none"  # too short to be kept as a secret: a placeholder
