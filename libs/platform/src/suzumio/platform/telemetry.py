"""OpenTelemetry for a process: traces and metrics, OTLP when configured, `/metrics` always.

Nothing is exported unless the standard `OTEL_EXPORTER_OTLP_*ENDPOINT` variables are set; the
Prometheus reader is always on so `/metrics` answers. Trace context crosses NATS in message
headers (`traceparent`), injected and extracted at the bus boundary, not in handlers.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, Sampler
from opentelemetry.trace import Link, Status
from opentelemetry.util.types import Attributes
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from suzumio.platform.logging import REDACTED, get_logger, redact_text, secret_name

log = get_logger(__name__)

METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST
# What is left to export at exit gets this long: the OTLP exporter retries a batch for up to
# 10 s when the collector is away, and a service must be gone within the grace period its
# supervisor gives it (10 s, after up to `drain_seconds` of draining).
SHUTDOWN_SECONDS = 2.0


def _otlp_configured(signal: str) -> bool:
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
    )


@dataclass
class Telemetry:
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    span_exporter: SpanExporter | None = None

    def shutdown(self, timeout: float = SHUTDOWN_SECONDS) -> None:
        """Export what is left, for `timeout` seconds at most, then drop it.

        `TracerProvider.shutdown` takes no timeout: it waits for the batch being exported,
        which an OTLP exporter retries for up to 10 s against a collector that is away. So it
        runs in a thread of its own, and after `timeout` the exporter is shut down, which
        ends its retries (both threads are daemons: the process may exit before them)."""
        spans = threading.Thread(
            target=self.tracer_provider.shutdown, name="otel-shutdown", daemon=True
        )
        spans.start()
        deadline = time.monotonic() + timeout
        self.meter_provider.shutdown(timeout_millis=timeout * 1_000)
        spans.join(max(deadline - time.monotonic(), 0.0))
        if spans.is_alive() and self.span_exporter is not None:
            self.span_exporter.shutdown()


_installed: Telemetry | None = None


def spans_exported() -> bool:
    """Whether spans go anywhere (an OTLP exporter is set): work done only to place spans in
    a trace (reading the log for a launch's origin) is skipped when none would be seen."""
    return _installed is not None and _installed.span_exporter is not None


def _attribute(value: Any) -> Any:
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Sequence) and not isinstance(value, bytes):
        return tuple(redact_text(v) if isinstance(v, str) else v for v in value)
    return value


def _attributes(attributes: Attributes) -> Attributes:
    if not attributes:
        return attributes
    return {k: REDACTED if secret_name(k) else _attribute(v) for k, v in attributes.items()}


class _RedactedSpan(ReadableSpan):
    """A finished span as it may leave the process: its texts redacted like a log line's."""

    def __init__(self, span: ReadableSpan) -> None:
        super().__init__(
            name=redact_text(span.name),
            context=span.context,
            parent=span.parent,
            resource=span.resource,
            attributes=_attributes(span.attributes),
            events=[Event(e.name, _attributes(e.attributes), e.timestamp) for e in span.events],
            links=[Link(link.context, _attributes(link.attributes)) for link in span.links],
            kind=span.kind,
            status=Status(
                span.status.status_code,
                redact_text(span.status.description) if span.status.description else None,
            ),
            start_time=span.start_time,
            end_time=span.end_time,
            instrumentation_scope=span.instrumentation_scope,
        )
        self._dropped = (span.dropped_attributes, span.dropped_events, span.dropped_links)

    @property
    def dropped_attributes(self) -> int:
        return self._dropped[0]

    @property
    def dropped_events(self) -> int:
        return self._dropped[1]

    @property
    def dropped_links(self) -> int:
        return self._dropped[2]


class RedactingSpanExporter(SpanExporter):
    """`inner`, fed spans with secrets redacted. A span records the exception that ended it
    (`exception.message`, `exception.stacktrace`) as it was raised; the log's redaction never
    sees those, so without this a secret the log hides would still reach the collector."""

    def __init__(self, inner: SpanExporter) -> None:
        self._inner = inner
        self._shut = threading.Lock()
        self._is_shut = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self._inner.export([_RedactedSpan(span) for span in spans])

    def shutdown(self) -> None:
        # Once: `Telemetry.shutdown` may cut the batch processor's own call short.
        with self._shut:
            if self._is_shut:
                return
            self._is_shut = True
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._inner.force_flush(timeout_millis)


def setup_telemetry(service: str, instance: str) -> Telemetry:
    """Install the process-wide tracer and meter providers (once; later calls reuse them).

    An `OTEL_*` value the SDK refuses (`OTEL_BSP_SCHEDULE_DELAY=0`, `OTEL_ATTRIBUTE_COUNT_LIMIT=x`)
    is logged and that part of the SDK gets its defaults, as OpenTelemetry's configuration
    spec asks: a tracing knob must not keep the service from starting."""
    global _installed  # noqa: PLW0603 - OpenTelemetry providers are process-global by design
    if _installed is not None:
        return _installed
    from opentelemetry.exporter.prometheus import (  # noqa: PLC0415 - imported when used
        PrometheusMetricReader,
    )

    resource = Resource.create(
        {"service.name": f"suzumio-{service}", "service.instance.id": instance}
    )
    exporting = _otlp_configured("TRACES")
    # Without an exporter spans are still made (trace ids reach logs and travel in headers)
    # but not recorded: recording spans nobody will read costs every request.
    sampler = ParentBased(ALWAYS_ON if exporting else ALWAYS_OFF)
    tracer_provider = _tracer_provider(resource, sampler)
    span_exporter: SpanExporter | None = None
    if exporting:
        span_exporter = _span_exporter()
    if span_exporter is not None:
        tracer_provider.add_span_processor(_batch_span_processor(span_exporter))
    readers: list[MetricReader] = [PrometheusMetricReader()]
    if _otlp_configured("METRICS") and (metric_exporter := _metric_exporter()) is not None:
        readers.append(_periodic_reader(metric_exporter))
    meter_provider = MeterProvider(resource=resource, metric_readers=readers, views=_VIEWS)
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    _installed = Telemetry(tracer_provider, meter_provider, span_exporter)
    return _installed


def _refused(part: str, exc: Exception) -> None:
    log.warning("telemetry.setting_refused", part=part, error=str(exc), using="defaults")


def _tracer_provider(resource: Resource, sampler: Sampler) -> TracerProvider:
    try:
        return TracerProvider(resource=resource, sampler=sampler)
    except ValueError as exc:  # an OTEL_*_LIMIT that is not a number
        _refused("span limits (OTEL_*_LIMIT)", exc)
    # Every limit given, so none is read from the environment: the SDK's defaults.
    limits = SpanLimits(
        max_attributes=128,
        max_events=128,
        max_links=128,
        max_span_attributes=128,
        max_event_attributes=128,
        max_link_attributes=128,
        max_attribute_length=SpanLimits.UNSET,
        max_span_attribute_length=SpanLimits.UNSET,
    )
    return TracerProvider(resource=resource, sampler=sampler, span_limits=limits)


def _span_exporter() -> SpanExporter | None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
        OTLPSpanExporter,
    )

    try:
        return RedactingSpanExporter(OTLPSpanExporter())
    except ValueError as exc:
        log.warning("telemetry.otlp_refused", signal="traces", error=str(exc))
        return None


def _batch_span_processor(exporter: SpanExporter) -> BatchSpanProcessor:
    try:
        return BatchSpanProcessor(exporter)
    except ValueError as exc:  # OTEL_BSP_* out of range
        _refused("span batches (OTEL_BSP_*)", exc)
    return BatchSpanProcessor(
        exporter,
        max_queue_size=2048,
        schedule_delay_millis=5000,
        max_export_batch_size=512,
        export_timeout_millis=30000,
    )


def _metric_exporter() -> MetricExporter | None:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # noqa: PLC0415
        OTLPMetricExporter,
    )

    try:
        return OTLPMetricExporter()
    except ValueError as exc:
        log.warning("telemetry.otlp_refused", signal="metrics", error=str(exc))
        return None


def _periodic_reader(exporter: MetricExporter) -> PeriodicExportingMetricReader:
    try:
        return PeriodicExportingMetricReader(exporter)
    except ValueError as exc:  # OTEL_METRIC_EXPORT_INTERVAL / _TIMEOUT out of range
        _refused("metric export (OTEL_METRIC_EXPORT_*)", exc)
    return PeriodicExportingMetricReader(
        exporter, export_interval_millis=60_000, export_timeout_millis=30_000
    )


def prometheus_text() -> bytes:
    """The current metrics in Prometheus text format, for `/metrics`."""
    return generate_latest()


def inject(headers: dict[str, str]) -> dict[str, str]:
    """Add the current trace context (`traceparent`, `tracestate`) to outgoing headers."""
    propagate.inject(headers)
    return headers


def inject_if_tracing(headers: dict[str, str]) -> dict[str, str]:
    """`inject`, skipped cheaply when no span is being recorded (hot paths)."""
    if trace.get_current_span().get_span_context().is_valid:
        propagate.inject(headers)
    return headers


def extract(headers: Mapping[str, str] | None) -> Context:
    """The trace context carried by incoming headers (an empty context when there is none)."""
    return propagate.extract(dict(headers or {}))


# Latency buckets in seconds: most of what we time takes between a millisecond and a second.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

# Every histogram in seconds: the SDK's default buckets (0, 5, 10, 25, ... 10000) are made for
# milliseconds, and would put every launch, tool call and scheduling decision under 5 s into
# one bucket, which makes their quantiles meaningless. `LATENCY_BUCKETS` and a tail for the
# slow things (a sandbox whose image is pulled, a long tool call); a histogram given its own
# boundaries (`explicit_bucket_boundaries_advisory`) gets these too, a superset of the
# `LATENCY_BUCKETS` all of them give.
SECONDS_BUCKETS = (*LATENCY_BUCKETS, 30.0, 60.0, 120.0, 300.0, 600.0)
_VIEWS = [
    View(
        instrument_type=Histogram,
        instrument_unit="s",
        aggregation=ExplicitBucketHistogramAggregation(SECONDS_BUCKETS),
    )
]


tracer = trace.get_tracer("suzumio.platform")
meter = metrics.get_meter("suzumio.platform")
