"""The closed set of event types, the envelope, upcasting, and the golden fixtures of every
published event version (like Temporal's replay tests: old events must always decode)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from suzumio.contracts.envelope import (
    EVENT_TYPES,
    UPCASTERS,
    DomainEvent,
    EventEnvelope,
    EventMeta,
    EventSchemaError,
    NewerSchemaError,
    UnknownEventTypeError,
    decode_data,
    envelope_for,
    event,
    upcast,
)
from suzumio.contracts.events import ProjectCreated, RuntimeProfileSet, SessionMessageAppended
from suzumio.contracts.values import Author, RuntimeProfileSpec

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "events"
GOLDEN = sorted(FIXTURES.glob("*/v*.json"))


def test_every_current_event_version_has_a_golden_fixture() -> None:
    published = {(p.parent.name, int(p.stem[1:])) for p in GOLDEN}
    current = {(name, cls.schema_version) for name, cls in EVENT_TYPES.items()}
    assert current <= published, f"add fixtures for {sorted(current - published)}"


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_golden_fixture_decodes_to_the_current_type(path: Path) -> None:
    envelope = EventEnvelope.model_validate_json(path.read_bytes())
    data = decode_data(envelope)
    assert type(data) is EVENT_TYPES[path.parent.name]
    assert envelope.type == path.parent.name
    assert envelope.schema_version == int(path.stem[1:])


def test_v1_message_is_upcast_to_the_current_schema() -> None:
    raw = json.loads((FIXTURES / "session.message_appended" / "v1.json").read_text())
    assert raw["schema"] == 1
    assert isinstance(raw["data"]["author"], str)  # the old shape

    data = decode_data(EventEnvelope.model_validate(raw))

    assert data == SessionMessageAppended(
        message_id="msg-0",
        author=Author(kind="agent", id="agent-1"),
        role="assistant",
        text="Hello from an older release.",
    )


def test_every_upcast_chain_is_complete() -> None:
    for name, cls in EVENT_TYPES.items():
        for schema in range(1, cls.schema_version):
            assert (name, schema) in UPCASTERS, f"{name} has no upcaster from v{schema}"


def test_unknown_type_and_future_schema_are_refused() -> None:
    with pytest.raises(UnknownEventTypeError):
        upcast("project.teleported", 1, {})
    with pytest.raises(NewerSchemaError):
        upcast("project.created", 99, {"name": "x", "owner_id": "u"})
    with pytest.raises(EventSchemaError) as missing:  # not newer: a later release won't help
        upcast("project.created", 0, {"name": "x", "owner_id": "u"})
    assert not isinstance(missing.value, NewerSchemaError)


def test_readers_ignore_fields_they_do_not_know() -> None:
    data = ProjectCreated.model_validate({"name": "p", "owner_id": "u", "added_later": 1})
    assert data == ProjectCreated(name="p", owner_id="u")


def test_readers_ignore_fields_they_do_not_know_inside_an_events_values() -> None:
    """A newer release gave a runtime profile (or a model spec) a field: the event is read
    here all the same, that field left out — it failed every read of its project before.
    The values still refuse unknown fields as input (the API's 422)."""
    event = RuntimeProfileSet(name="fast", spec=RuntimeProfileSpec())
    envelope = envelope_for(event, aggregate_id="p" * 26, version=1, meta=EventMeta())
    written = envelope.data | {"spec": envelope.data["spec"] | {"added_later": {"x": 1}}}
    assert decode_data(envelope.model_copy(update={"data": written})) == event
    with pytest.raises(ValidationError):
        RuntimeProfileSpec.model_validate(written["spec"])


def test_envelope_round_trips_with_the_schema_alias() -> None:
    env = envelope_for(
        ProjectCreated(name="p", owner_id="u"),
        aggregate_id="proj-1",
        version=1,
        meta=EventMeta(actor="user:u", correlation_id="c"),
    )
    wire = json.loads(env.model_dump_json(by_alias=True))
    assert wire["schema"] == 1
    assert wire["aggregate"] == "project"
    assert EventEnvelope.model_validate(wire) == env


def test_event_types_are_registered_once_and_well_formed() -> None:
    with pytest.raises(ValueError, match="twice"):
        event("project.created")(type("Again", (DomainEvent,), {}))
    with pytest.raises(ValueError, match="look like"):
        event("nodot")


def test_events_are_frozen() -> None:
    data = ProjectCreated(name="p", owner_id="u")
    with pytest.raises(ValidationError):
        data.name = "q"  # type: ignore[misc]
