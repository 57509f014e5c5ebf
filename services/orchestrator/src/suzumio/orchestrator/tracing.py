"""The launch's place in a trace (DESIGN.md §11): an activation's launch span continues the
trace of what asked for it, and the runner continues the launch's.

What asked for it is read from the log: the headers of the message that stored the request
(`traceparent`, when its writer appended it inside a span), else those of the messages that
stored the batch's signals — a message posted through the gateway is stored by the session
service's handler of its command, inside the request's trace. The first context found is the
launch's parent; the other signals' traces, if they are others, are its links (one activation
answers several requests). The follower that folds the log hands the orchestrator no headers,
so they are read back by Direct Get (a few small reads per launch, at once; none when no span
is exported); a read that fails or is slow leaves the launch a trace of its own, never the
launch undone.

The runner gets the launch's context in the standard `TRACEPARENT` environment variable,
which every backend passes to its sandbox, and sends it as `traceparent` on each call to the
tool-broker, whose spans then belong to the activation's trace.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from nats.aio.client import Client as NATS
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanContext

from suzumio.platform import telemetry
from suzumio.platform.bus.direct_get import first_after
from suzumio.platform.logging import get_logger

log = get_logger(__name__)

TRACEPARENT = "TRACEPARENT"  # the environment variable (W3C trace context for processes)
MAX_ORIGINS = 8  # messages read for one launch: its request's and its first signals'
ORIGIN_SECONDS = 2.0  # for all of them together


async def origin(
    nc: NATS, stream: str, subject: str, seqs: Sequence[int]
) -> tuple[Context | None, tuple[Link, ...]]:
    """The context a launch continues and the links to the other traces it answers, from the
    messages at `seqs` (on `subject`), in order of preference."""
    wanted = list(dict.fromkeys(s for s in seqs if s > 0))[:MAX_ORIGINS]
    if not wanted or not telemetry.spans_exported():  # reads for a trace nobody sees: none
        return None, ()
    reads = [_context_at(nc, stream, subject, seq) for seq in wanted]
    found: list[SpanContext | BaseException | None] = []
    with contextlib.suppress(TimeoutError):
        found = await asyncio.wait_for(
            asyncio.gather(*reads, return_exceptions=True), ORIGIN_SECONDS
        )
    contexts = [c for c in found if isinstance(c, SpanContext)]
    if not contexts:
        return None, ()
    parent, *others = contexts
    seen = {parent.trace_id}
    links: list[Link] = []
    for other in others:
        if other.trace_id not in seen:
            seen.add(other.trace_id)
            links.append(Link(other))
    return trace.set_span_in_context(trace.NonRecordingSpan(parent)), tuple(links)


async def _context_at(nc: NATS, stream: str, subject: str, seq: int) -> SpanContext | None:
    try:
        stored = await first_after(nc, stream, subject, seq - 1, timeout=ORIGIN_SECONDS)
    except Exception as exc:  # a trace is worth no failure of the launch
        log.debug("orchestrator.trace_origin_unread", seq=seq, error=repr(exc)[:200])
        return None
    if stored is None or stored.seq != seq:
        return None
    context = trace.get_current_span(telemetry.extract(stored.headers)).get_span_context()
    return context if context.is_valid else None


def traceparent(span: trace.Span) -> dict[str, str]:
    """The sandbox's environment entry that hands `span`'s context to the runner."""
    if not span.get_span_context().is_valid:
        return {}
    headers: dict[str, str] = {}
    propagate.inject(headers, context=trace.set_span_in_context(span))
    value = headers.get("traceparent")
    return {TRACEPARENT: value} if value else {}
