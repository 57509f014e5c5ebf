"""Turning stored messages into typed events, decoding only what some projection reads."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from pydantic import ValidationError

from suzumio.contracts.envelope import (
    EVENT_TYPES,
    DomainEvent,
    EventEnvelope,
    EventSchemaError,
    RecordedEvent,
    decode_data,
)
from suzumio.platform.bus.eventstore import HDR_TYPE
from suzumio.platform.logging import get_logger

log = get_logger(__name__)
_warned_unknown: set[str] = set()


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One message of the log as a projector sees it.

    `event` is None when no projection wants the type, when the type is unknown to this code
    (skipped with a warning), or when it could not be decoded (`error` says why).
    """

    seq: int
    subject: str
    type: str
    event: RecordedEvent[DomainEvent] | None = None
    error: str | None = None


def decode_entry(
    seq: int, subject: str, headers: Mapping[str, str] | None, data: bytes, wanted: AbstractSet[str]
) -> LogEntry:
    event_type = (headers or {}).get(HDR_TYPE)
    envelope: EventEnvelope | None = None
    try:
        if event_type is None:  # written without our headers: read the type from the body
            envelope = EventEnvelope.model_validate_json(data)
            event_type = envelope.type
        if event_type not in EVENT_TYPES:  # written by a newer release: skip, never crash
            if event_type not in _warned_unknown:
                _warned_unknown.add(event_type)
                log.warning("event.unknown_type_skipped", type=event_type, seq=seq)
            return LogEntry(seq, subject, event_type)
        if event_type not in wanted:
            return LogEntry(seq, subject, event_type)
        envelope = envelope or EventEnvelope.model_validate_json(data)
        return LogEntry(
            seq, subject, event_type, RecordedEvent(envelope, decode_data(envelope), seq)
        )
    except (ValidationError, EventSchemaError, ValueError) as exc:
        return LogEntry(
            seq, subject, event_type or "?", error=f"{type(exc).__name__}: {exc}"[:2_000]
        )
