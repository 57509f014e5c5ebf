"""A refusal of an id already used is typed, not told by its words: a keyed retry whose first
attempt's answer was lost (the gateway, the tool-broker) looks for it to answer as the first
attempt did, and a refusal of the request itself (a closed session) must never pass for it."""

from __future__ import annotations

from suzumio.contracts.errors import (
    ID_TAKEN,
    CommandError,
    ConflictError,
    ErrorBody,
    NotFoundError,
    id_taken,
    is_id_taken,
)


def over_the_wire(exc: CommandError) -> CommandError:
    """As a command's reply carries it to its sender."""
    return CommandError.from_body(ErrorBody.model_validate_json(exc.to_body().model_dump_json()))


def test_an_id_taken_is_told_by_its_reason_across_the_wire() -> None:
    refused = over_the_wire(id_taken("a session"))
    assert isinstance(refused, ConflictError)
    assert refused.message == "a session with this id exists already"
    assert is_id_taken(refused)
    # However a later release words it.
    assert is_id_taken(over_the_wire(ConflictError("that id is in use", reason=ID_TAKEN)))


def test_other_refusals_are_not_an_id_taken() -> None:
    assert not is_id_taken(over_the_wire(ConflictError("the session is closed")))
    assert not is_id_taken(over_the_wire(ConflictError("the agent is disabled", reason="x")))
    assert not is_id_taken(NotFoundError("no session with this id exists already"))


def test_a_service_of_the_release_before_is_understood_by_its_words() -> None:
    """Mid-upgrade, a session service of the release before says it only in words."""
    assert is_id_taken(over_the_wire(ConflictError("a message with this id exists already")))
