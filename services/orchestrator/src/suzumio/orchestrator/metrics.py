"""The orchestrator's metrics (DESIGN.md §11): activation latency by stage, live activations,
pool queue depth, model tokens, the model failures that ended activations and every failed
model call the runners report.

Labels are bounded: stages, states and failure classes are fixed sets, pools are the
operator's; never an id. What the runner reports (its output's usage and text) comes from the
sandbox and is not trusted: a class it names that is not one of the runner's is `unknown`, a
token count that is not a plausible integer is not counted.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from opentelemetry.metrics import CallbackOptions, Observation

from suzumio.contracts.envelope import DomainEvent
from suzumio.contracts.events import ActivationFailed, ActivationOutputRecorded
from suzumio.platform.telemetry import SECONDS_BUCKETS, meter

if TYPE_CHECKING:
    from suzumio.orchestrator.engine import Orchestrator

Stage = Literal["queued", "launching", "total"]

# The runner's failure classes (`suzumio.runner.loop.failures.FailureClass`); its output says
# "the model failed: <class>: <message>" when every model of the chain failed.
MODEL_FAILURE_CLASSES = frozenset(
    {
        "rate_limit",
        "overloaded",
        "server_error",
        "transport",
        "auth",
        "forbidden",
        "billing",
        "model_not_found",
        "context_overflow",
        "payload_too_large",
        "content_policy",
        "output_truncated",
        "unknown",
    }
)
MODEL_FAILED_PREFIX = "the model failed: "
MAX_TOKENS = 10**10  # a count above this in one activation is nonsense, not usage
MAX_CALL_FAILURES = 10**6  # nor failed model calls above this (the budget is ~90 calls)

_stages = meter.create_histogram(
    "suzumio_activation_stage_seconds",
    unit="s",
    description="activation latency by stage: queued (requested to launch called), launching "
    "(launch called to sandbox started), total (requested to its terminal event)",
    explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
)
_tokens = meter.create_counter(
    "suzumio_model_tokens", description="model tokens the ended activations report, by kind"
)
_model_errors = meter.create_counter(
    "suzumio_model_errors",
    description="activations ended by a model failure, by the runner's failure class",
)
_call_failures = meter.create_counter(
    "suzumio_model_call_failures",
    description="failed model calls the ended activations report, by the runner's failure "
    "class, the ones a retry, a compaction or a fallback got past included",
)

_watched: list[Orchestrator] = []


def stage(name: Stage, seconds: float) -> None:
    _stages.record(max(seconds, 0.0), {"stage": name})


def since(at: datetime | None, now: float | None = None) -> float | None:
    """Seconds from `at` (the log's time of an event) to `now` (wall clock)."""
    if at is None:
        return None
    return (time.time() if now is None else now) - at.timestamp()


def ended(event: DomainEvent, output: ActivationOutputRecorded | None) -> None:
    """An activation's terminal event was stored by this replica (once per activation): the
    tokens its output reports, and the model failure that ended it, if one did."""
    if output is None:
        return
    for kind in ("prompt", "completion"):
        count = _count(output.usage, f"{kind}_tokens")
        if count:
            _tokens.add(count, {"kind": kind})
    for cls, calls in call_failures(output.usage).items():
        _call_failures.add(calls, {"class": cls})
    if isinstance(event, ActivationFailed) and output.reason == "failed":
        failure = model_failure(output.text)
        if failure is not None:
            _model_errors.add(1, {"class": failure})


def model_failure(text: str) -> str | None:
    """The failure class of a runner's output that says the model failed, else None."""
    if not text.startswith(MODEL_FAILED_PREFIX):
        return None
    named = text[len(MODEL_FAILED_PREFIX) :].split(":", 1)[0].strip()
    return named if named in MODEL_FAILURE_CLASSES else "unknown"


def call_failures(usage: Mapping[str, Any]) -> dict[str, int]:
    """The failed model calls a runner's usage reports (`model_failures`), by failure class: a
    class that is not one of the runner's counts as `unknown`, a count that is not a
    plausible integer not at all."""
    reported = usage.get("model_failures")
    counted: dict[str, int] = {}
    if not isinstance(reported, Mapping):
        return counted
    for name, count in reported.items():
        if isinstance(count, bool) or not isinstance(count, int):
            continue
        if not 0 < count <= MAX_CALL_FAILURES:
            continue
        failure = name if name in MODEL_FAILURE_CLASSES else "unknown"
        counted[failure] = counted.get(failure, 0) + count
    return counted


def _count(usage: Mapping[str, Any], key: str) -> int:
    value = usage.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKENS:
        return 0
    return value


# -- gauges: what the leading replica has at the moment of a scrape ---------------------------
def watch(orchestrator: Orchestrator) -> None:
    """Report `orchestrator`'s live activations and pool queues (while it leads)."""
    _watched.append(orchestrator)


def _live(_: CallbackOptions) -> Iterable[Observation]:
    for orchestrator in tuple(_watched):
        if not orchestrator.leading:
            continue  # the leader reports: the replicas' sum is the platform's
        try:
            # One C-level copy: no await (nor the loop's thread switching) can come in between.
            tracked = tuple(orchestrator.activations.values())
        except RuntimeError:  # changed while a thread of the exporter copied it
            continue
        live = [t for t in tracked if not t.ended]
        running = sum(1 for t in live if t.started)
        yield Observation(running, {"state": "running"})
        yield Observation(len(live) - running, {"state": "waiting"})


def _queues(_: CallbackOptions) -> Iterable[Observation]:
    for orchestrator in tuple(_watched):
        if not orchestrator.leading:
            continue
        for entry in orchestrator.health_report:
            pools = entry.get("pools")
            if entry.get("name") != "pool" or not isinstance(pools, dict):
                continue
            for pool, depth in pools.items():
                if not isinstance(depth, dict):
                    continue
                for state in ("pending", "in_flight"):
                    value = depth.get(state)
                    if isinstance(value, int):
                        yield Observation(value, {"pool": str(pool), "state": state})


meter.create_observable_gauge(
    "suzumio_activations_live",
    callbacks=[_live],
    description="activations not ended, by state: waiting (not started) and running",
)
meter.create_observable_gauge(
    "suzumio_pool_queue_depth",
    callbacks=[_queues],
    description="dispatches in the ACTIVATIONS stream per pool: pending (waiting for a worker) "
    "and in_flight (held by one), as of the last health check",
)
