"""Where a span continues a trace that lives in the log (DESIGN.md §11): the trace contexts
stored with the messages of an aggregate's subject, read back by Direct Get.

The followers that fold the log hand their services no headers, so a service that wants to
place a span in the trace of what caused its work (the scheduler's decision, in the trace of
the signal it starts; the orchestrator's launch, in the trace of the request) reads the
`traceparent` of those messages again: a few small reads at once, none when no span is
exported. A read that fails or is slow leaves the span a trace of its own, never the work
undone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from nats.aio.client import Client as NATS
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanContext

from suzumio.platform import telemetry
from suzumio.platform.bus.direct_get import first_after
from suzumio.platform.logging import get_logger

log = get_logger(__name__)

MAX_ORIGINS = 8  # messages read for one span
ORIGIN_SECONDS = 2.0  # for all of them together


async def origin(
    nc: NATS, stream: str, subject: str, seqs: Sequence[int]
) -> tuple[Context | None, tuple[Link, ...]]:
    """The context a span continues and the links to the other traces it answers, from the
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
    except Exception as exc:  # a trace is worth no failure of the work
        log.debug("trace.origin_unread", seq=seq, error=repr(exc)[:200])
        return None
    if stored is None or stored.seq != seq:
        return None
    context = trace.get_current_span(telemetry.extract(stored.headers)).get_span_context()
    return context if context.is_valid else None
