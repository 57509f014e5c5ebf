"""OpenTelemetry for a process: traces and metrics, OTLP when configured, `/metrics` always.

Nothing is exported unless the standard `OTEL_EXPORTER_OTLP_*ENDPOINT` variables are set; the
Prometheus reader is always on so `/metrics` answers. Trace context crosses NATS in message
headers (`traceparent`), injected and extracted at the bus boundary, not in handlers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased
from opentelemetry.trace import Link, Status
from opentelemetry.util.types import Attributes
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from suzumio.platform.logging import REDACTED, redact_text, secret_name

METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST


def _otlp_configured(signal: str) -> bool:
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
    )


@dataclass
class Telemetry:
    tracer_provider: TracerProvider
    meter_provider: MeterProvider

    def shutdown(self) -> None:
        self.meter_provider.shutdown(timeout_millis=2_000)
        self.tracer_provider.shutdown()


_installed: Telemetry | None = None


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

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self._inner.export([_RedactedSpan(span) for span in spans])

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._inner.force_flush(timeout_millis)


def setup_telemetry(service: str, instance: str) -> Telemetry:
    """Install the process-wide tracer and meter providers (once; later calls reuse them)."""
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
    tracer_provider = TracerProvider(resource=resource, sampler=sampler)
    if exporting:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,
        )

        tracer_provider.add_span_processor(
            BatchSpanProcessor(RedactingSpanExporter(OTLPSpanExporter()))
        )
    readers: list[MetricReader] = [PrometheusMetricReader()]
    if _otlp_configured("METRICS"):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # noqa: PLC0415
            OTLPMetricExporter,
        )

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    _installed = Telemetry(tracer_provider, meter_provider)
    return _installed


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

tracer = trace.get_tracer("suzumio.platform")
meter = metrics.get_meter("suzumio.platform")
