"""Turning stored messages into typed events, decoding only what some projection reads.

A message holds one event or a commit of several (see the event store); its `Suzumio-Type`
header lists their types, so a message nobody reads is skipped without being parsed.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from pydantic import ValidationError

from suzumio.contracts.envelope import (
    EVENT_TYPES,
    DomainEvent,
    NewerSchemaError,
    RecordedEvent,
    decode_data,
)
from suzumio.platform.bus.eventstore import envelopes_of, types_of
from suzumio.platform.logging import get_logger

log = get_logger(__name__)
_warned_unknown: set[str] = set()


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One message of the log as a projector sees it: the events of it some projection reads
    (in order), and `error` when the message could not be decoded at all."""

    seq: int
    subject: str
    types: tuple[str, ...]
    events: tuple[RecordedEvent[DomainEvent], ...] = ()
    error: str | None = None
    newer: bool = False  # written by a newer release's schema: wait for the upgrade


def _known(event_type: str, seq: int) -> bool:
    if event_type in EVENT_TYPES:
        return True
    if event_type not in _warned_unknown:  # written by a newer release: skip, never crash
        _warned_unknown.add(event_type)
        log.warning("event.unknown_type_skipped", type=event_type, seq=seq)
    return False


def decode_entry(
    seq: int,
    subject: str,
    headers: Mapping[str, str] | None,
    data: bytes,
    wanted: AbstractSet[str],
) -> LogEntry:
    types = types_of(dict(headers or {}))
    if types is not None and not any(t in wanted or t not in EVENT_TYPES for t in types):
        return LogEntry(seq, subject, tuple(types))
    try:
        envelopes = envelopes_of(data)
        events = tuple(
            RecordedEvent(envelope, decode_data(envelope), seq)
            for envelope in envelopes
            if _known(envelope.type, seq) and envelope.type in wanted
        )
        return LogEntry(seq, subject, tuple(e.type for e in envelopes), events)
    except NewerSchemaError as exc:
        return LogEntry(seq, subject, tuple(types or ("?",)), error=str(exc)[:2_000], newer=True)
    except (ValidationError, ValueError) as exc:  # a missing upcaster too: parked, not waited on
        return LogEntry(
            seq, subject, tuple(types or ("?",)), error=f"{type(exc).__name__}: {exc}"[:2_000]
        )
