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


UNKNOWN = "?"  # the types of a message without the header that names them: any at all


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One message of the log as a projector sees it: the events of it some projection reads
    (in order); and, of those that could not be decoded, `error` and their types — `failed`
    to be parked, `newer` (written by a newer release's schema) to be waited on. An event
    decoded beside them is applied all the same: a commit of several events does not lose
    its good ones to one bad one."""

    seq: int
    subject: str
    types: tuple[str, ...]
    events: tuple[RecordedEvent[DomainEvent], ...] = ()
    error: str | None = None
    failed: tuple[str, ...] = ()
    newer: tuple[str, ...] = ()


def concerns(handles: AbstractSet[str], types: tuple[str, ...]) -> bool:
    """Whether a projection handling `handles` reads any of `types` (UNKNOWN: perhaps)."""
    return UNKNOWN in types or not handles.isdisjoint(types)


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
    except NewerSchemaError as exc:
        unknown = tuple(types or (UNKNOWN,))
        return LogEntry(seq, subject, unknown, error=str(exc)[:2_000], newer=unknown)
    except (ValidationError, ValueError) as exc:  # no commit of events at all: parked
        unknown = tuple(types or (UNKNOWN,))
        error = f"{type(exc).__name__}: {exc}"[:2_000]
        return LogEntry(seq, subject, unknown, error=error, failed=unknown)
    events: list[RecordedEvent[DomainEvent]] = []
    errors: list[str] = []
    failed: list[str] = []
    newer: list[str] = []
    for envelope in envelopes:
        if not (_known(envelope.type, seq) and envelope.type in wanted):
            continue
        try:
            events.append(RecordedEvent(envelope, decode_data(envelope), seq))
        except NewerSchemaError as exc:
            newer.append(envelope.type)
            errors.append(f"{envelope.type}: {exc}")
        except (ValidationError, ValueError) as exc:  # a missing upcaster too: parked, not held
            failed.append(envelope.type)
            errors.append(f"{envelope.type}: {type(exc).__name__}: {exc}")
    return LogEntry(
        seq,
        subject,
        tuple(e.type for e in envelopes),
        tuple(events),
        error="; ".join(errors)[:2_000] if errors else None,
        failed=tuple(failed),
        newer=tuple(newer),
    )
