"""Log redaction: secrets stay out of logs wherever they hide in an event."""

from __future__ import annotations

import json
import logging

import pytest

from suzumio.platform.logging import REDACTED, configure_logging, get_logger

API_KEY = "szm_k1_" + "A" * 32
PROVIDER_KEY = "sk-" + "b" * 40


def lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in capsys.readouterr().err.splitlines() if line]


def test_nested_values_and_secret_named_fields_are_redacted(
    json_logs: pytest.CaptureFixture[str],
) -> None:
    configure_logging("test", fmt="json")
    get_logger("t").info(
        "call",
        request={"headers": {"Authorization": "Bearer x"}, "args": [f"key={API_KEY}"]},
        api_key="plain",
        note=f"using {PROVIDER_KEY}",
        count=3,
    )
    [line] = lines(json_logs)
    assert line["api_key"] == REDACTED
    assert line["note"] == f"using {REDACTED}"
    assert line["request"] == {"headers": {"Authorization": REDACTED}, "args": [f"key={REDACTED}"]}
    assert line["count"] == 3


def test_tracebacks_are_redacted_from_structlog_and_stdlib(
    json_logs: pytest.CaptureFixture[str],
) -> None:
    configure_logging("test", fmt="json")
    try:
        int(f"bad key {API_KEY}")
    except ValueError:
        get_logger("t").exception("failed")
        logging.getLogger("lib").exception("also failed with %s", PROVIDER_KEY)
    found = lines(json_logs)
    assert [line["event"] for line in found] == ["failed", f"also failed with {REDACTED}"]
    for line in found:
        assert "ValueError: invalid literal" in str(line["exception"])
        assert API_KEY not in json.dumps(line)
        assert PROVIDER_KEY not in json.dumps(line)
