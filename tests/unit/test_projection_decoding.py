"""A message of the log holds one event or a commit of several. One of them that cannot be
decoded is parked (or waited on, if a newer release wrote it) for the projections that read
its type only: the other events of the commit are applied as ever — a user's message and its
signal are one commit, and a bad signal must not take the message out of the history. A
message that names no types (no header) and cannot be read is parked for every projection,
never passed over without a trace."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest

from suzumio.contracts.envelope import DomainEvent, EventMeta, envelope_for
from suzumio.contracts.events import SessionMessageAppended, SignalRecorded
from suzumio.contracts.values import Author, Priority, SignalKind
from suzumio.platform.projections.apply import PoisonTracker, apply_entries, first_newer
from suzumio.platform.projections.decoding import UNKNOWN, LogEntry, decode_entry

MESSAGE, SIGNAL = SessionMessageAppended.event_type, SignalRecorded.event_type
SUBJECT = "ev.session.s1"


class Recording:
    """A projection that records what it is given (applied unguarded: no savepoints)."""

    name: ClassVar[str] = "recording"
    version: ClassVar[int] = 1

    def __init__(self, *handles: str) -> None:
        self.handles = frozenset(handles)
        self.applied: list[str] = []

    async def apply(self, conn: object, schema: str, events: list[Any]) -> None:
        self.applied += [e.type for e in events]


def commit(signal_data: dict[str, Any] | None = None) -> bytes:
    """A user's message and its signal, one commit, as the session service appends them;
    the signal's data replaced by `signal_data` if given."""
    events: list[DomainEvent] = [
        SessionMessageAppended(
            message_id="m1", author=Author(kind="user", id="u"), role="user", text="hi"
        ),
        SignalRecorded(
            signal_id="g1", agent_id="a", kind=SignalKind.USER_MESSAGE, priority=Priority.P1
        ),
    ]
    envelopes = [
        json.loads(
            envelope_for(e, aggregate_id="s1", version=n, meta=EventMeta()).model_dump_json(
                by_alias=True
            )
        )
        for n, e in enumerate(events, start=1)
    ]
    if signal_data is not None:
        envelopes[1]["data"] = signal_data
    return json.dumps(envelopes).encode()


HEADERS = {"Suzumio-Type": f"{MESSAGE},{SIGNAL}"}


async def applied(entry: LogEntry, projection: Recording) -> tuple[list[str], list[str]]:
    parked = await apply_entries(
        None,  # type: ignore[arg-type]  # unguarded, the connection is the projection's
        projection,  # type: ignore[arg-type]
        "s",
        [entry],
        PoisonTracker(),
        guarded=False,
    )
    return projection.applied, [p.type for p in parked]


async def test_a_bad_event_of_a_commit_is_parked_alone() -> None:
    bad = {"signal_id": "g1", "agent_id": "a", "kind": "user_message", "priority": "bogus"}
    entry = decode_entry(7, SUBJECT, HEADERS, commit(bad), frozenset({MESSAGE, SIGNAL}))
    assert [e.type for e in entry.events] == [MESSAGE]
    assert entry.failed == (SIGNAL,)
    assert entry.error is not None
    assert SIGNAL in entry.error

    assert await applied(entry, Recording(MESSAGE)) == ([MESSAGE], [])  # the history
    assert await applied(entry, Recording(MESSAGE, SIGNAL)) == ([MESSAGE], [SIGNAL])
    assert await applied(entry, Recording(SIGNAL)) == ([], [SIGNAL])


async def test_a_whole_commit_decoded_parks_nothing() -> None:
    entry = decode_entry(7, SUBJECT, HEADERS, commit(), frozenset({MESSAGE, SIGNAL}))
    assert (entry.error, entry.failed, entry.newer) == (None, (), ())
    assert await applied(entry, Recording(MESSAGE, SIGNAL)) == ([MESSAGE, SIGNAL], [])


@pytest.mark.parametrize("headers", [None, HEADERS])
async def test_a_message_that_is_no_commit_is_parked_for_those_that_may_read_it(
    headers: dict[str, str] | None,
) -> None:
    entry = decode_entry(7, SUBJECT, headers, b"\x00 not json", frozenset({MESSAGE, SIGNAL}))
    assert entry.events == ()
    assert entry.error is not None
    assert entry.failed == ((UNKNOWN,) if headers is None else (MESSAGE, SIGNAL))
    assert await applied(entry, Recording(MESSAGE)) == ([], [",".join(entry.failed)])


def test_an_event_of_a_newer_schema_holds_only_the_projections_that_read_it() -> None:
    envelopes = json.loads(commit())
    envelopes[1]["schema"] = 99
    data = json.dumps(envelopes).encode()
    entry = decode_entry(7, SUBJECT, HEADERS, data, frozenset({MESSAGE, SIGNAL}))
    assert [e.type for e in entry.events] == [MESSAGE]
    assert entry.newer == (SIGNAL,)
    assert first_newer(Recording(SIGNAL), [entry]) is entry  # type: ignore[arg-type]
    assert first_newer(Recording(MESSAGE), [entry]) is None  # type: ignore[arg-type]
