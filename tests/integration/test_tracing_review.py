"""The launch's place in a trace, read back from the log (real NATS), and the event store's
count of refused conditional appends."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys

import pytest
from nats.aio.client import Client as NATS
from opentelemetry import context, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from suzumio.contracts.events import SessionClosed
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.orchestrator.tracing import TRACEPARENT, origin, traceparent
from suzumio.platform import telemetry
from suzumio.platform.bus.eventstore import EventStore


def _context(trace_id: int) -> SpanContext:
    return SpanContext(
        trace_id, secrets.randbits(64) or 1, is_remote=False, trace_flags=TraceFlags(1)
    )


async def _append_in(
    store: EventStore, session_id: str, version: int, ctx: SpanContext | None
) -> int:
    """An event on the session's subject, its message stored inside `ctx`'s trace; its seq."""
    token = context.attach(trace.set_span_in_context(NonRecordingSpan(ctx))) if ctx else None
    try:
        result = await store.append(session_id, [SessionClosed(reason="x")], version)
    finally:
        if token is not None:
            context.detach(token)
    return result.seq


async def test_the_launch_continues_the_first_trace_the_log_tells_and_links_the_others(
    nc: NATS, topology: Topology, store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(telemetry, "spans_exported", lambda: True)  # as with an exporter
    session_id = new_id()
    first, second = _context(secrets.randbits(128)), _context(secrets.randbits(128))
    plain = await _append_in(store, session_id, 0, None)  # the scheduler's request: no context
    signal = await _append_in(store, session_id, 1, first)
    again = await _append_in(store, session_id, 2, first)  # the same request's trace again
    other = await _append_in(store, session_id, 3, second)
    subject = topology.event_subject("session", session_id)

    parent, links = await origin(
        nc, topology.events_stream, subject, (plain, signal, again, other, 999_999)
    )

    assert parent is not None
    found = trace.get_current_span(parent).get_span_context()
    assert (found.trace_id, found.span_id) == (first.trace_id, first.span_id)
    assert [link.context.trace_id for link in links] == [second.trace_id]


async def test_without_an_exporter_the_log_is_not_read_for_a_trace(
    nc: NATS, topology: Topology, store: EventStore
) -> None:
    """No OTLP exporter (this process has none): the launch reads nothing for its origin,
    which no one would see; it costs a launch no Direct Get."""
    assert not telemetry.spans_exported()
    session_id = new_id()
    signal = await _append_in(store, session_id, 0, _context(secrets.randbits(128)))
    subject = topology.event_subject("session", session_id)
    assert await origin(nc, topology.events_stream, subject, (signal,)) == (None, ())


async def test_a_log_without_contexts_gives_a_trace_of_its_own(
    nc: NATS, topology: Topology, store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(telemetry, "spans_exported", lambda: True)  # as with an exporter
    session_id = new_id()
    plain = await _append_in(store, session_id, 0, None)
    subject = topology.event_subject("session", session_id)
    assert await origin(nc, topology.events_stream, subject, (plain, 0)) == (None, ())
    # A sequence of another subject is not taken for this one's.
    elsewhere = await _append_in(store, new_id(), 0, _context(secrets.randbits(128)))
    assert await origin(nc, topology.events_stream, subject, (elsewhere,)) == (None, ())


def test_the_sandbox_gets_the_launchs_context() -> None:
    ctx = _context(0x0AF7651916CD43DD8448EB211C80319C)
    env = traceparent(NonRecordingSpan(ctx))
    assert re.fullmatch(r"00-0af7651916cd43dd8448eb211c80319c-[0-9a-f]{16}-01", env[TRACEPARENT])
    assert traceparent(NonRecordingSpan(trace.INVALID_SPAN_CONTEXT)) == {}


_CONFLICTS = """
import asyncio, sys
from suzumio.platform import telemetry

telemetry.setup_telemetry("probe", "probe-1")
from suzumio.contracts.events import SessionClosed
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus import connection
from suzumio.platform.bus.eventstore import ConcurrencyConflictError, EventStore
from suzumio.platform.bus.jsapi import ensure_streams

async def main():
    topology = Topology(namespace=sys.argv[2])
    nc = await connection.connect(sys.argv[1], "probe")
    await ensure_streams(nc, topology.streams())
    store = EventStore(nc, topology)
    await store.append("s1", [SessionClosed(reason="x")], 0)
    try:  # a writer that did not see the first: refused by what the store has seen
        await store.append("s1", [SessionClosed(reason="y")], 0)
    except ConcurrencyConflictError:
        pass
    other = EventStore(nc, topology)  # one that knows nothing: refused by the server
    await other.append("s2", [SessionClosed(reason="x")], 0)
    try:
        await store.append("s2", [SessionClosed(reason="y")], 0)
    except ConcurrencyConflictError:
        pass
    await nc.close()

asyncio.run(main())
print(telemetry.prometheus_text().decode())
"""


def test_every_refused_conditional_append_is_counted(nats_url: str) -> None:
    """A conditional append the store refused before sending it (its own view of the head
    says the writer is stale) was not counted: `suzumio_event_appends_total{outcome="conflict"}`
    missed most conflicts of a busy aggregate, whose writers see each other's appends."""
    namespace = f"t{secrets.token_hex(6)}"
    done = subprocess.run(  # noqa: S603 - our own interpreter and program
        [sys.executable, "-c", _CONFLICTS, nats_url, namespace],
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    counts = {
        m.group(1): float(m.group(2))
        for m in re.finditer(
            r'^suzumio_event_appends_total\{.*outcome="(\w+)".*\} (\S+)$', done.stdout, re.MULTILINE
        )
    }
    assert counts == {"ok": 2.0, "conflict": 2.0}, counts
