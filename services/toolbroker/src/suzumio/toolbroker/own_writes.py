"""The broker's own writes to an activation's subject (audit records, the output): on the
version it knows, and after a conflict on what the subject holds — where a write another
replica made for the same call (a runner's retry that reached it first) is found, and not
made twice."""

from __future__ import annotations

import asyncio

from suzumio.contracts.envelope import DomainEvent, EventMeta
from suzumio.contracts.events import ActivationOutputRecorded, ToolCallFinished, ToolCallStarted
from suzumio.contracts.events.activation import TERMINAL_ACTIVATION_EVENTS
from suzumio.platform.bus.eventstore import AggregateStream, ConcurrencyConflictError, Head
from suzumio.toolbroker.problems import BrokerError
from suzumio.toolbroker.registry import LiveActivation
from suzumio.toolbroker.state import Broker

APPEND_ATTEMPTS = 5


async def append_own(
    broker: Broker, a: LiveActivation, events: list[DomainEvent], actor: str
) -> bool:
    """Append the broker's own events to the activation (the caller holds its lock): whether
    this call wrote them (False: the subject held them already, written by another replica
    or an attempt whose answer was lost). The version is known — what this replica last
    wrote, or what it folded of the activation's subject — which saves a lookup; a write it
    has not seen yet makes it a conflict, and then the subject is read."""
    meta = EventMeta(actor=actor)
    # Checked with the version taken, no wait between: every event up to a folded version was
    # folded, so none of them ended the activation, and the append is conditional on nothing
    # having come after it.
    if a.fenced:
        raise BrokerError(403, "fenced", f"the activation is {a.fenced}")
    if a.logged > (a.version or 0):  # the store needs the sequence of what it writes after
        broker.store.observe("activation", a.id, a.logged, a.logged_seq)
    known = max(a.version or 0, a.logged)
    if known:
        try:
            a.version = (await broker.store.append(a.id, events, known, meta)).version
        except ConcurrencyConflictError:
            pass
        else:
            return True
    return await _append_after_reading(broker, a, events, meta)


async def _append_after_reading(
    broker: Broker, a: LiveActivation, events: list[DomainEvent], meta: EventMeta
) -> bool:
    """Someone else wrote (another replica, or the orchestrator's end): look before writing,
    and again each time another write slips in between. Conflicts that outlast the attempts
    leave as `ConcurrencyConflictError`, which the runner is told to retry (503): the call
    was fine, it only lost races."""
    for attempt in range(APPEND_ATTEMPTS):
        stream = await broker.store.load("activation", a.id)
        if any(e.envelope.type in TERMINAL_ACTIVATION_EVENTS for e in stream.events):
            a.fenced = "ended"
            raise BrokerError(403, "fenced", "the activation is ended")
        events = [e for e in events if not _recorded(stream, e)]
        if not events:
            return False  # written already, by another replica or an attempt whose answer was lost
        try:
            a.version = (await broker.store.append(a.id, events, stream.version, meta)).version
        except ConcurrencyConflictError:
            if attempt == APPEND_ATTEMPTS - 1:
                raise
            await asyncio.sleep(0.01 * 2**attempt)
        else:
            return True
    return False  # (not reached: the last attempt returns or raises)


def _recorded(stream: AggregateStream, event: DomainEvent) -> bool:
    """Whether the subject holds `event`'s record already: a call's start or finish by its
    id, the output (one an activation)."""
    if isinstance(event, ToolCallStarted | ToolCallFinished):
        return _has_call(stream, type(event), event.call_id)
    if isinstance(event, ActivationOutputRecorded):
        return any(isinstance(e.data, ActivationOutputRecorded) for e in stream.events)
    return False


def _has_call(
    stream: AggregateStream, kind: type[ToolCallStarted | ToolCallFinished], call_id: str
) -> bool:
    return any(isinstance(e.data, kind) and e.data.call_id == call_id for e in stream.events)


async def output_in_log(broker: Broker, a: LiveActivation) -> bool:
    """Whether the activation's output is on record (by another replica, or by this one
    before it folded it): the subject after what was folded here, which would have said so
    (a fenced sandbox sending its output again and again must not make each call read its
    whole subject — up to a hundred thousand tool-call events)."""
    stream = await broker.store.load("activation", a.id, after=Head(a.logged, a.logged_seq))
    if any(isinstance(e.data, ActivationOutputRecorded) for e in stream.events):
        a.output = True
    return a.output


async def started_in_log(broker: Broker, a: LiveActivation, call_id: str) -> bool:
    """A call this replica has not seen start may have started on another (a retry that
    reached it first), not folded here yet: the subject says, after what was folded here (a
    sandbox finishing calls it never started must not make each finish read its whole
    subject)."""
    stream = await broker.store.load("activation", a.id, after=Head(a.logged, a.logged_seq))
    if _has_call(stream, ToolCallStarted, call_id):
        a.calls_started.add(call_id)
        return True
    return False
