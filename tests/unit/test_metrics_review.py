"""DESIGN.md §11 metrics that did not exist, and labels that must stay bounded.

The metrics are read as Prometheus text, from a process of their own (`setup_telemetry`
installs process-wide providers once)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from suzumio.contracts.runner import ToolDefinition
from suzumio.contracts.toolpacks import ToolpackManifest
from suzumio.orchestrator.metrics import MODEL_FAILURE_CLASSES, model_failure
from suzumio.runner.broker import traceparent
from suzumio.runner.loop.failures import FailureClass
from suzumio.runner.tools.core import CORE_TOOLS
from suzumio.runner.tools.registry import BUILTIN_TOOLS as RUNNER_TOOLS
from suzumio.toolbroker.state import BUILTIN_TOOLS, Metrics


def _run(program: str) -> str:
    done = subprocess.run(  # noqa: S603 - our own interpreter and program
        [sys.executable, "-c", program],
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _samples(text: str, name: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(rf"{name}(\{{[^}}]*\}})? (\S+)$", line)
        if m:  # its own labels, in order, without OpenTelemetry's scope
            pairs = re.findall(r'(\w+)="([^"]*)"', m.group(1) or "")
            own = sorted(f'{k}="{v}"' for k, v in pairs if not k.startswith("otel_scope_"))
            found["{" + ",".join(own) + "}" if own else ""] = float(m.group(2))
    return found


_ORCHESTRATOR = """
from types import SimpleNamespace
from suzumio.platform import telemetry

telemetry.setup_telemetry("probe", "probe-1")
from suzumio.contracts.events import ActivationCompleted, ActivationFailed, ActivationOutputRecorded
from suzumio.orchestrator import metrics

def output(text, usage, reason="failed"):
    return ActivationOutputRecorded(text=text, usage=usage, reason=reason)

metrics.ended(
    ActivationCompleted(text="ok", usage={}),
    output(
        "ok",
        # Two rate limits and a transport failure a retry or a fallback got past.
        {"prompt_tokens": 11, "completion_tokens": 5,
         "model_failures": {"rate_limit": 2, "transport": 1}},
        "completed",
    ),
)
# From the sandbox: nothing it says may become a series of its own, nor a count it is not.
metrics.ended(
    ActivationFailed(reason="x"),
    output(
        "the model failed: rate_limit: slow down",
        {"prompt_tokens": "9", "completion_tokens": True,
         "model_failures": {"rate_limit": 3, "made-up-0123": 2, "auth": True, "server_error": -1}},
    ),
)
metrics.ended(
    ActivationFailed(reason="x"),
    output("the model failed: act-0123456789abcdef: made up", {"prompt_tokens": -4}),
)
metrics.ended(
    ActivationFailed(reason="x"),
    output("runner exit 1", {"prompt_tokens": 10**12, "model_failures": ["rate_limit"]}),
)
metrics.ended(
    ActivationFailed(reason="x"),
    output("runner exit 1", {"model_failures": {"overloaded": 10**9, "transport": "4"}}),
)
metrics.ended(ActivationFailed(reason="lost"), None)
for stage, seconds in (("queued", 0.02), ("launching", 0.4), ("total", 3.0)):
    metrics.stage(stage, seconds)

ended = SimpleNamespace(ended=True, started=True)
running = SimpleNamespace(ended=False, started=True)
waiting = SimpleNamespace(ended=False, started=False)
leader = SimpleNamespace(
    leading=True,
    activations={"a": ended, "b": running, "c": running, "d": waiting},
    health_report=[
        {"name": "process", "ok": True},
        {
            "name": "pool",
            "ok": True,
            "pools": {"default": {"pending": 3, "in_flight": 1, "workers": []}},
        },
    ],
)
follower = SimpleNamespace(
    leading=False, activations={"e": running}, health_report=leader.health_report
)
metrics.watch(leader)
metrics.watch(follower)
print(telemetry.prometheus_text().decode())
"""


def test_the_orchestrators_new_metrics_with_bounded_labels() -> None:
    text = _run(_ORCHESTRATOR)
    tokens = _samples(text, "suzumio_model_tokens_total")
    assert tokens == {'{kind="prompt"}': 11.0, '{kind="completion"}': 5.0}, tokens
    errors = _samples(text, "suzumio_model_errors_total")
    assert errors == {'{class="rate_limit"}': 1.0, '{class="unknown"}': 1.0}, errors
    # Every failed call, also those the activation got past; a class the runner does not
    # have is `unknown`, a count that is not a plausible integer is not counted.
    calls = _samples(text, "suzumio_model_call_failures_total")
    assert calls == {
        '{class="rate_limit"}': 5.0,
        '{class="transport"}': 1.0,
        '{class="unknown"}': 2.0,
    }, calls
    stages = _samples(text, "suzumio_activation_stage_seconds_count")
    assert stages == {f'{{stage="{s}"}}': 1.0 for s in ("queued", "launching", "total")}
    # Its own buckets: a launch of 0.4 s is not lost among a 5 s bucket's.
    buckets = _samples(text, "suzumio_activation_stage_seconds_bucket")
    assert buckets['{le="0.5",stage="launching"}'] == 1.0
    assert buckets['{le="0.25",stage="launching"}'] == 0.0
    # Only the leader reports: the replicas' sum is the platform's.
    live = _samples(text, "suzumio_activations_live")
    assert live == {'{state="running"}': 2.0, '{state="waiting"}': 1.0}, live
    depth = _samples(text, "suzumio_pool_queue_depth")
    assert depth == {
        '{pool="default",state="pending"}': 3.0,
        '{pool="default",state="in_flight"}': 1.0,
    }, depth
    assert "act-0123456789abcdef" not in text
    assert "made-up-0123" not in text


def test_model_failure_classes_are_the_runners() -> None:
    assert {c.value for c in FailureClass} == MODEL_FAILURE_CLASSES
    assert model_failure("the model failed: auth: 401 invalid key") == "auth"
    assert model_failure("the model failed: whatever the sandbox says") == "unknown"
    assert model_failure("the tool-broker refused a request: 422") is None


def test_builtin_tools_are_the_runners() -> None:
    assert set(RUNNER_TOOLS) | set(CORE_TOOLS) == BUILTIN_TOOLS


_BROKER = """
from suzumio.platform import telemetry

telemetry.setup_telemetry("probe", "probe-1")
from suzumio.contracts.runner import ToolDefinition
from suzumio.contracts.toolpacks import ToolpackManifest
from suzumio.toolbroker.state import Metrics

acme = ToolpackManifest(name="acme", tools=(ToolDefinition(name="acme.search"),))
metrics = Metrics.of({"acme": acme})
for tool, packs in (
    ("shell.exec", ()),
    ("acme.search", ("acme",)),
    ("acme.search", ()),  # installed, but not this activation's
    ("x" * 200, ("acme",)),  # anything a sandbox makes up
    ("session-0123456789abcdef", ()),
):
    metrics.tool_call(metrics.tool_label(tool, packs), "started")
metrics.tool_call("", "ok", 1500)  # a finish whose start this replica never saw
print(telemetry.prometheus_text().decode())
"""


def test_tool_call_labels_are_bounded() -> None:
    """`suzumio_tool_calls_total{tool}` took the name the sandbox sent: an agent (or a prompt
    injection) making up a name per call made a series per call, without end."""
    text = _run(_BROKER)
    calls = _samples(text, "suzumio_tool_calls_total")
    assert calls == {
        '{status="started",tool="shell.exec"}': 1.0,
        '{status="started",tool="acme.search"}': 1.0,
        '{status="started",tool="other"}': 3.0,
        '{status="ok",tool="-"}': 1.0,
    }, calls
    buckets = _samples(text, "suzumio_tool_call_seconds_bucket")
    assert buckets['{le="2.5",status="ok",tool="-"}'] == 1.0
    assert buckets['{le="1.0",status="ok",tool="-"}'] == 0.0


def test_the_label_of_a_tool_of_an_enabled_toolpack() -> None:
    metrics = Metrics.of(
        {"acme": ToolpackManifest(name="acme", tools=(ToolDefinition(name="acme.search"),))}
    )
    assert metrics.tool_label("acme.search", ("acme",)) == "acme.search"
    assert metrics.tool_label("acme.search", ("other",)) == "other"
    assert metrics.tool_label("file.read", ()) == "file.read"


@pytest.mark.parametrize(
    ("value", "header"),
    [
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", True),
        (" 00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-00 ", True),
        ("00-00000000000000000000000000000000-b7ad6b7169203331-01", False),
        ("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", False),
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\nX-Evil: 1", False),
        ("garbage", False),
        ("", False),
    ],
)
def test_the_runner_sends_a_valid_traceparent_only(value: str, header: bool) -> None:
    sent = traceparent({"TRACEPARENT": value})
    assert bool(sent) is header
    if header:
        assert sent["traceparent"] == value.strip().lower()
