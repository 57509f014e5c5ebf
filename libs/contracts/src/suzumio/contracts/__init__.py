"""Suzumio's contracts: events, commands, the runner contract, subjects. Pydantic only, no I/O."""

from suzumio.contracts import events  # registers every event type
from suzumio.contracts.envelope import (
    EVENT_TYPES,
    DomainEvent,
    EventEnvelope,
    EventMeta,
    RecordedEvent,
    UnknownEventTypeError,
    decode_data,
    envelope_for,
)
from suzumio.contracts.subjects import DEFAULT_TOPOLOGY, Topology

__all__ = [
    "DEFAULT_TOPOLOGY",
    "EVENT_TYPES",
    "DomainEvent",
    "EventEnvelope",
    "EventMeta",
    "RecordedEvent",
    "Topology",
    "UnknownEventTypeError",
    "decode_data",
    "envelope_for",
    "events",
]
