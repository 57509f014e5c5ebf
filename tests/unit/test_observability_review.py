"""Telemetry under odd settings and failure: buckets, shutdown time, OTEL_* values refused.

`setup_telemetry` installs process-wide providers once, so each case runs in a process of its
own, with the OTLP endpoint pointed at a collector of this test's (or at none)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

_HISTOGRAMS = """
from suzumio.platform import telemetry

telemetry.setup_telemetry("probe", "probe-1")
# as the orchestrator, the tool-broker and the scheduler make theirs: seconds, no buckets given
launch = telemetry.meter.create_histogram("suzumio_probe_launch_seconds", unit="s")
for seconds in (0.05, 0.2, 0.8, 1.5, 3.0):
    launch.record(seconds)
print(telemetry.prometheus_text().decode())
"""


def _run(program: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - our own interpreter and program
        [sys.executable, "-c", program, *args],
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_histograms_in_seconds_have_buckets_below_five_seconds() -> None:
    """The SDK's default buckets are for milliseconds (0, 5, 10, 25, ...): every activation
    launch, tool call and scheduling delay under 5 s fell into one bucket, and a p50 or p99
    over them said 2.5 s or so, whatever the truth."""
    done = _run(_HISTOGRAMS, {})
    assert done.returncode == 0, done.stderr
    buckets = {
        line.split('le="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in done.stdout.splitlines()
        if line.startswith("suzumio_probe_launch_seconds_bucket{")
    }
    assert buckets["0.1"] == 1
    assert buckets["1.0"] == 3
    assert buckets["5.0"] == 5
    assert buckets["600.0"] == 5  # and room for a slow sandbox start


_SHUTDOWN = """
import time
from suzumio.platform import telemetry

handle = telemetry.setup_telemetry("probe", "probe-1")
with telemetry.tracer.start_as_current_span("probe"):
    pass
telemetry.meter.create_counter("suzumio_probe").add(1)
started = time.monotonic()
handle.shutdown()
print(time.monotonic() - started)
"""


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_shutdown_with_the_collector_away_is_bounded() -> None:
    """`TracerProvider.shutdown` waits for the last batch, which the OTLP exporter retries
    for up to 10 s: after its drain a service with its collector down took ~8 s more to exit,
    past the grace period its supervisor gives it."""
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    done = _run(_SHUTDOWN, {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.strip().splitlines()[-1]) < 4.0


class _Collector(BaseHTTPRequestHandler):
    paths: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 - the standard library's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).paths.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def collector() -> Iterator[str]:
    _Collector.paths = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


_ODD = """
from suzumio.platform import telemetry
from suzumio.platform.logging import configure_logging

configure_logging("probe", fmt="json")
handle = telemetry.setup_telemetry("probe", "probe-1")
with telemetry.tracer.start_as_current_span("probe"):
    pass
telemetry.meter.create_counter("suzumio_probe").add(1)
handle.shutdown()
"""


@pytest.mark.parametrize(
    "odd",
    [
        {"OTEL_BSP_SCHEDULE_DELAY": "0"},
        {"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "5000", "OTEL_BSP_MAX_QUEUE_SIZE": "10"},
        {"OTEL_METRIC_EXPORT_INTERVAL": "0"},
        {"OTEL_ATTRIBUTE_COUNT_LIMIT": "many"},
    ],
)
def test_an_otel_value_the_sdk_refuses_is_logged_not_a_crash(
    odd: dict[str, str], collector: str
) -> None:
    """The SDK raises ValueError from its constructors for these: the service died at start
    with a traceback, for a tracing knob. OpenTelemetry's configuration spec asks to warn and
    use the default; traces and metrics still go out."""
    started = time.monotonic()
    done = _run(_ODD, {"OTEL_EXPORTER_OTLP_ENDPOINT": collector, **odd})
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30
    warnings = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert any(w["event"] == "telemetry.setting_refused" for w in warnings), done.stderr
    assert "/v1/traces" in _Collector.paths
    assert "/v1/metrics" in _Collector.paths


# -- redaction ---------------------------------------------------------------------------------


def test_redaction_of_urls_takes_linear_time() -> None:
    """Every string of every log line goes through `redact_text`, on the event loop. The URL
    pattern was tried from each letter of a run like `a.a.a.a...` to its end: 60 KB of it
    before a `://` and an `@` took seconds."""
    from suzumio.platform.logging import REDACTED, redact_text  # noqa: PLC0415

    text = "a." * 30_000 + " nats://user:secret@host"
    started = time.perf_counter()
    redacted = redact_text(text)
    assert time.perf_counter() - started < 0.5
    assert redacted.endswith(f"nats://user:{REDACTED}@host")


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("DATABASE_URL_postgresql://suzumio:hunter2hunter2@db/suzumio", "hunter2hunter2"),
        ("retry 1https://user:s3cr3t-pass@example.com failed", "s3cr3t-pass"),
    ],
)
def test_a_urls_password_is_redacted_when_the_scheme_follows_a_word(text: str, secret: str) -> None:
    """The pattern wanted a word boundary before the scheme: after `_` or a digit there is
    none, and the password went into the log as it was."""
    from suzumio.platform.logging import redact_text  # noqa: PLC0415

    assert secret not in redact_text(text)


# -- dashboards --------------------------------------------------------------------------------

_ROOT = Path(__file__).resolve().parents[2]
_SOURCES = [
    p
    for top in ("libs", "services", "runner")
    for p in (_ROOT / top).rglob("*.py")
    if "/tests/" not in str(p) and ".venv" not in p.parts
]
_INSTRUMENT = re.compile(r"create_(counter|histogram|observable_gauge|gauge)\(\s*\"(suzumio_\w+)\"")
_PROM_SUFFIXES = ("_bucket", "_count", "_sum")


def _exported() -> dict[str, tuple[str, Path]]:
    """Each instrument the code makes, by the name Prometheus shows it under (OpenTelemetry's
    translation: counters get `_total`, histograms in seconds `_seconds`)."""
    found: dict[str, tuple[str, Path]] = {}
    for path in _SOURCES:
        text = path.read_text()
        for match in _INSTRUMENT.finditer(text):
            kind, name = match.groups()
            call = text[match.end() : match.end() + 300].split("create_", 1)[0]
            if kind == "counter":
                name += "_total"
            elif kind == "histogram" and 'unit="s"' in call and not name.endswith("_seconds"):
                name += "_seconds"
            found[name] = (kind, path)
    return found


def _queries() -> list[str]:
    dashboards = sorted((_ROOT / "deploy" / "grafana" / "dashboards").glob("*.json"))
    assert dashboards
    return [
        target["expr"]
        for dashboard in dashboards
        for panel in json.loads(dashboard.read_text())["panels"]
        for target in panel.get("targets", [])
    ]


def test_dashboards_query_what_the_code_exports_and_show_all_of_it() -> None:
    """DESIGN §11: the dashboards show activations by outcome, their latency by stage, tool
    calls by tool and outcome with their duration, projection lag, appends and conflicts. They
    showed the event log and the bus only; every activation and tool metric had no panel."""
    exported = _exported()
    assert "suzumio_activations_total" in exported  # the scan finds what services make
    used: set[str] = set()
    for expr in _queries():
        for name in re.findall(r"\bsuzumio_\w+", expr):
            base = next((name[: -len(s)] for s in _PROM_SUFFIXES if name.endswith(s)), name)
            assert base in exported, f"{expr}: {name} is exported by no code"
            kind, path = exported[base]
            if name != base:
                assert kind == "histogram", f"{expr}: {base} is a {kind}"
            labels = re.findall(r"\bby \(([^)]*)\)", expr) + re.findall(r"(\w+)!?=~?\"", expr)
            # where it is made, or beside it (a gauge's callback: the runtime's lag gauge)
            source = "".join(sibling.read_text() for sibling in path.parent.glob("*.py"))
            for label in (lb.strip() for group in labels for lb in group.split(",")):
                if label in ("le", "job", ""):
                    continue
                assert f'"{label}":' in source, f"{expr}: {base} has no label {label}"
            used.add(base)
    assert set(exported) - used == set(), "metrics no dashboard shows"
