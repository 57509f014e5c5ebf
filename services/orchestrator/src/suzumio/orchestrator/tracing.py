"""The launch's place in a trace (DESIGN.md §11): an activation's launch span continues the
trace of what asked for it, and the runner continues the launch's.

What asked for it is read from the log (`suzumio.platform.trace_origin`): the headers of the
message that stored the request — the scheduler appends it inside a span of its own, which
continues the trace of the batch's first signal — else those of the messages that stored the
batch's signals (a message posted through the gateway is stored by the session service's
handler of its command, inside the request's trace).

The runner gets the launch's context in the standard `TRACEPARENT` environment variable,
which every backend passes to its sandbox, and sends it as `traceparent` on each call to the
tool-broker, whose spans then belong to the activation's trace.
"""

from __future__ import annotations

from opentelemetry import propagate, trace

from suzumio.platform.trace_origin import origin

__all__ = ["TRACEPARENT", "origin", "traceparent"]

TRACEPARENT = "TRACEPARENT"  # the environment variable (W3C trace context for processes)


def traceparent(span: trace.Span) -> dict[str, str]:
    """The sandbox's environment entry that hands `span`'s context to the runner."""
    if not span.get_span_context().is_valid:
        return {}
    headers: dict[str, str] = {}
    propagate.inject(headers, context=trace.set_span_in_context(span))
    value = headers.get("traceparent")
    return {TRACEPARENT: value} if value else {}
