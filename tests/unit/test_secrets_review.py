"""Secrets stay out of what leaves a process: log lines and exported spans (DESIGN.md §10).

Secrets without a shape of their own (a NATS token, a Postgres password, an activation token,
the Fernet secret key, whatever a person sends as `access_token`) are found by where they
stand; headers and fields by their names in any spelling; a span's recorded exception and
attributes are redacted like a log line before the OTLP exporter sends them.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import structlog
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from suzumio.platform.logging import REDACTED, get_logger
from suzumio.platform.secrets import SecretBox
from suzumio.platform.tokens import TokenSigner
from tests.support import configure_logging_uncached as configure_logging

PG_PASSWORD = "Pg-Pass-wOrd-7c2d1e9f"  # noqa: S105 - test values
DSN = f"postgresql://suzumio:{PG_PASSWORD}@db.internal:5432/suzumio"
NATS_TOKEN = "NatsTokenValue-9a8b7c6d5e4f"  # noqa: S105
NATS_URL = f"nats://{NATS_TOKEN}@nats.internal:4222"
OPAQUE = "opaque-Credential-31f5a0c2b9"


def _lines(capsys: pytest.CaptureFixture[str], event: str | None = None) -> list[dict[str, object]]:
    """The captured log lines (of `event` only, if given: a task an earlier test left in this
    process may log meanwhile)."""
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line]
    return [line for line in lines if event is None or line.get("event") == event]


def _activation_token(key: str) -> str:
    return TokenSigner([key]).issue(
        activation_id="act_1",
        session_id="ses_1",
        project_id="prj_1",
        agent_id="agt_1",
        ttl=timedelta(minutes=5),
    )


def test_credentials_in_urls_dsns_and_headers_are_redacted(
    json_logs: pytest.CaptureFixture[str],
) -> None:
    configure_logging("test", fmt="json")
    key = SecretBox.generate_key()
    token = _activation_token(key)
    log = get_logger("t")
    log.warning("db.failed", error=f"connect to {DSN} refused")
    log.warning("nats.failed", error=f"no servers: [{NATS_URL!r}]")
    log.warning("ws", event_path=f"/v1/sessions/s/stream?access_token={OPAQUE}&since=3")
    log.warning("dsn", error=f"host=db.internal password={PG_PASSWORD} dbname=suzumio")
    log.warning("http", error=f"sent Authorization: Bearer {token}", note=f"token {token}")
    log.warning("settings", error=f"SUZUMIO_SECRET_KEY={key} is not the key that sealed it")
    logging.getLogger("uvicorn.error").info(
        '%s - "WebSocket %s" 403', "127.0.0.1:1", f"/v1/s/stream?access_token={OPAQUE}"
    )
    found = _lines(json_logs)
    text = json.dumps(found)
    for secret in (PG_PASSWORD, NATS_TOKEN, OPAQUE, token, key):
        assert secret not in text
    # what is not secret stays readable
    assert (
        found[0]["error"]
        == f"connect to postgresql://suzumio:{REDACTED}@db.internal:5432/suzumio refused"
    )
    assert f"nats://{REDACTED}@nats.internal:4222" in str(found[1]["error"])
    assert found[2]["event_path"] == f"/v1/sessions/s/stream?access_token={REDACTED}&since=3"
    assert found[3]["error"] == f"host=db.internal password={REDACTED} dbname=suzumio"
    assert (
        found[-1]["event"] == f'127.0.0.1:1 - "WebSocket /v1/s/stream?access_token={REDACTED}" 403'
    )


def test_secret_fields_are_redacted_whatever_their_spelling(
    json_logs: pytest.CaptureFixture[str],
) -> None:
    configure_logging("test", fmt="json")
    get_logger("t").info(
        "request",
        headers={
            "X-API-Key": OPAQUE,
            "Proxy-Authorization": f"Basic {OPAQUE}",
            "Set-Cookie": f"s={OPAQUE}",
            "x-auth-token": OPAQUE,
            "content-type": "application/json",
        },
        accessToken=OPAQUE,
        database_dsn=OPAQUE,
        client={"clientSecret": OPAQUE, "id": "c1"},
        max_tokens=512,
        key_id="k1",
    )
    [line] = _lines(json_logs, "request")
    assert OPAQUE not in json.dumps(line)
    assert line["headers"] == {
        "X-API-Key": REDACTED,
        "Proxy-Authorization": REDACTED,
        "Set-Cookie": REDACTED,
        "x-auth-token": REDACTED,
        "content-type": "application/json",
    }
    assert line["client"] == {"clientSecret": REDACTED, "id": "c1"}
    assert (line["max_tokens"], line["key_id"]) == (512, "k1")


class _RefusedError(Exception):
    def __init__(self, url: str) -> None:
        super().__init__(f"could not reach {url}")
        self.url = url


def test_values_shown_by_their_repr_are_redacted(json_logs: pytest.CaptureFixture[str]) -> None:
    """The renderer shows anything that is not JSON by its repr: an exception passed as a
    field, not as `repr(exc)`, names the URL all the same."""
    configure_logging("test", fmt="json")
    get_logger("t").warning("connect.failed", error=_RefusedError(NATS_URL), retries=3)
    [line] = _lines(json_logs, "connect.failed")
    assert NATS_TOKEN not in json.dumps(line)
    assert f"nats://{REDACTED}@nats.internal:4222" in str(line["error"])


def test_console_lines_are_redacted_too(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        configure_logging("test", fmt="console")
        get_logger("t").warning("db.failed", error=f"connect to {DSN} refused")
        logging.getLogger("lib").warning("nats at %s", NATS_URL)
    finally:
        structlog.reset_defaults()
        root.handlers[:], root.level = handlers, level
    err = capsys.readouterr().err
    assert "db.failed" in err
    assert "nats at" in err
    assert PG_PASSWORD not in err
    assert NATS_TOKEN not in err


# -- spans ------------------------------------------------------------------------------------

_SPAN_PROGRAM = """
import sys
from suzumio.platform import telemetry

handle = telemetry.setup_telemetry("probe", "probe-1")
dsn, nats_url, opaque, token = sys.argv[1:5]
try:
    # as a consumer or command span does: the exception that ends it is recorded on it
    with telemetry.tracer.start_as_current_span("consume probe") as span:
        span.set_attribute("http.request.header.authorization", "Bearer " + token)
        span.set_attribute("url.full", "http://gw/v1/stream?access_token=" + opaque)
        span.set_attribute("db.connection_string", dsn)
        raise ConnectionError("connect to " + dsn + " and " + nats_url + " failed")
except ConnectionError:
    pass
handle.shutdown()
"""


class _Collector(BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802 - the standard library's name
        length = int(self.headers.get("Content-Length") or 0)
        type(self).bodies.append(self.rfile.read(length))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def test_a_spans_recorded_exception_and_attributes_are_redacted_before_export() -> None:
    """With OTLP configured, a span that ends in an exception carries its message and
    stack trace (`exception.message`, `exception.stacktrace`): the log redacts such text,
    the exporter must too."""
    token = _activation_token(SecretBox.generate_key())
    _Collector.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{server.server_port}/v1/traces",
    }
    try:
        done = subprocess.run(  # noqa: S603 - our own interpreter and program
            [sys.executable, "-c", _SPAN_PROGRAM, DSN, NATS_URL, OPAQUE, token],
            env=env,
            capture_output=True,
            timeout=60,
            check=False,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stderr.decode()
    sent = b"".join(_Collector.bodies)
    assert sent, "no span was exported"
    for secret in (PG_PASSWORD, NATS_TOKEN, OPAQUE, token):
        assert secret.encode() not in sent
    request = ExportTraceServiceRequest()
    request.ParseFromString(_Collector.bodies[0])
    [span] = [s for r in request.resource_spans for ss in r.scope_spans for s in ss.spans]
    attributes = {a.key: a.value.string_value for a in span.attributes}
    assert attributes["http.request.header.authorization"] == REDACTED
    assert attributes["url.full"] == f"http://gw/v1/stream?access_token={REDACTED}"
    assert attributes["db.connection_string"] == (
        f"postgresql://suzumio:{REDACTED}@db.internal:5432/suzumio"
    )
    [exception] = [e for e in span.events if e.name == "exception"]
    recorded = {a.key: a.value.string_value for a in exception.attributes}
    assert recorded["exception.type"] == "ConnectionError"
    assert f"nats://{REDACTED}@nats.internal:4222" in recorded["exception.message"]
    assert "ConnectionError" in recorded["exception.stacktrace"]
