"""The event envelope, the registry of event types, and upcasting of old schema versions.

Every fact Suzumio keeps is an event: an `EventEnvelope` on the subject of its aggregate
(`ev.<aggregate>.<id>`), whose `data` is one of the registered `DomainEvent` payloads. The set
of types is closed: a type is registered once, with `@event(...)`, in `suzumio.contracts.events`.
Payloads change by adding a new schema version and a pure `@upcaster` that lifts the previous
version's data, so readers only ever see the newest shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from suzumio.contracts.ids import Identifier, new_id

JsonObject = dict[str, Any]


class DomainEvent(BaseModel):
    """Base of every event payload: frozen, and tolerant of fields it does not know."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    event_type: ClassVar[str]
    aggregate: ClassVar[str]
    schema_version: ClassVar[int]


E = TypeVar("E", bound=DomainEvent)
Upcaster = Callable[[JsonObject], JsonObject]

EVENT_TYPES: dict[str, type[DomainEvent]] = {}
UPCASTERS: dict[tuple[str, int], Upcaster] = {}


def event(event_type: str, *, schema: int = 1) -> Callable[[type[E]], type[E]]:
    """Register a payload class as the event type `event_type` at schema version `schema`.

    The aggregate is the part of the type before the first dot (`session.opened` belongs to
    the `session` aggregate), so the type alone tells which subject family carries it.
    """
    aggregate, _, name = event_type.partition(".")
    if not aggregate or not name:
        raise ValueError(f"event type {event_type!r} must look like '<aggregate>.<name>'")

    def register(cls: type[E]) -> type[E]:
        if event_type in EVENT_TYPES:
            raise ValueError(f"event type {event_type!r} is registered twice")
        cls.event_type = event_type
        cls.aggregate = aggregate
        cls.schema_version = schema
        EVENT_TYPES[event_type] = cls
        return cls

    return register


def upcaster(event_type: str, *, from_schema: int) -> Callable[[Upcaster], Upcaster]:
    """Register a pure function lifting `event_type` data from `from_schema` to the next one."""

    def register(fn: Upcaster) -> Upcaster:
        key = (event_type, from_schema)
        if key in UPCASTERS:
            raise ValueError(f"upcaster {key!r} is registered twice")
        UPCASTERS[key] = fn
        return fn

    return register


class EventEnvelope(BaseModel):
    """What is stored in the log: one event with who, when, why and where it sits."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    id: str = Field(description="UUIDv7 of the event; also the JetStream Nats-Msg-Id")
    type: str = Field(description="registered event type, e.g. 'session.opened'")
    aggregate: str
    aggregate_id: Identifier
    version: int = Field(ge=1, description="1-based position of the event in its aggregate")
    occurred_at: datetime
    actor: str = Field(description="who caused it: 'user:<id>', 'agent:<id>' or 'system:<svc>'")
    correlation_id: str
    causation_id: str | None = None
    schema_version: int = Field(default=1, ge=1, alias="schema")
    data: JsonObject


class EventMeta(BaseModel):
    """The why of an append, copied onto every envelope it writes."""

    model_config = ConfigDict(frozen=True)

    actor: str = "system:unknown"
    correlation_id: str = Field(default_factory=new_id)
    causation_id: str | None = None


class UnknownEventTypeError(LookupError):
    """An envelope whose type this code does not know (written by a newer release)."""


class EventSchemaError(ValueError):
    """An envelope whose schema version cannot be brought to the current one."""


class NewerSchemaError(EventSchemaError):
    """An envelope written at a schema newer than this code's (by a newer release): a later
    release reads it, unlike a schema this code should read but cannot (a missing upcaster)."""


def envelope_for(
    data: DomainEvent,
    *,
    aggregate_id: str,
    version: int,
    meta: EventMeta,
    event_id: str | None = None,
    occurred_at: datetime | None = None,
) -> EventEnvelope:
    """Wrap a payload into the envelope that will be appended at `version`.

    The payload is already validated and the rest is built here, so the envelope is constructed
    without validating again: this sits on the append hot path.
    """
    return EventEnvelope.model_construct(
        id=event_id or new_id(),
        type=data.event_type,
        aggregate=data.aggregate,
        aggregate_id=aggregate_id,
        version=version,
        occurred_at=occurred_at or datetime.now(UTC),
        actor=meta.actor,
        correlation_id=meta.correlation_id,
        causation_id=meta.causation_id,
        schema_version=data.schema_version,
        data=data.model_dump(mode="json"),
    )


def upcast(event_type: str, schema: int, data: JsonObject) -> JsonObject:
    """Bring `data` written at `schema` up to the registered schema of `event_type`."""
    cls = EVENT_TYPES.get(event_type)
    if cls is None:
        raise UnknownEventTypeError(event_type)
    if schema > cls.schema_version:
        raise NewerSchemaError(
            f"{event_type} schema {schema} is newer than this code's {cls.schema_version}"
        )
    while schema < cls.schema_version:
        step = UPCASTERS.get((event_type, schema))
        if step is None:
            raise EventSchemaError(f"no upcaster for {event_type} from schema {schema}")
        data = step(data)
        schema += 1
    return data


def decode_data(envelope: EventEnvelope) -> DomainEvent:
    """The typed payload of an envelope, upcast to the current schema."""
    data = upcast(envelope.type, envelope.schema_version, envelope.data)
    # Fields this release does not know are ignored all the way down, not only the event's
    # own: a value inside one (a runtime profile, model or loop settings, which refuse unknown
    # fields as input) given a field by a newer release failed every read of the event here —
    # a 500 for every command on its project, a projector parking it — through a rolling
    # upgrade. (An event whose meaning changed bumps its schema version instead.)
    return EVENT_TYPES[envelope.type].model_validate(data, extra="ignore")


@dataclass(frozen=True, slots=True)
class RecordedEvent(Generic[E]):
    """An event as read back from the log: its envelope, typed payload and stream position."""

    envelope: EventEnvelope
    data: E
    seq: int

    @property
    def id(self) -> str:
        return self.envelope.id

    @property
    def type(self) -> str:
        return self.envelope.type

    @property
    def aggregate_id(self) -> str:
        return self.envelope.aggregate_id

    @property
    def version(self) -> int:
        return self.envelope.version

    @property
    def occurred_at(self) -> datetime:
        return self.envelope.occurred_at
