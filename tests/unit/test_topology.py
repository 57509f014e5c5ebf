from __future__ import annotations

import pytest
from pydantic import ValidationError

from suzumio.contracts.subjects import DEFAULT_TOPOLOGY, Retention, Storage, Topology


def test_default_names_follow_the_design() -> None:
    t = DEFAULT_TOPOLOGY
    assert t.event_subject("session", "s1") == "ev.session.s1"
    assert t.events_filter("session") == "ev.session.*"
    assert t.live_subject("s1") == "live.session.s1"
    assert t.activation_subject("gpu") == "act.gpu"
    assert t.command_subject("session", "open_session") == "cmd.session.open_session"
    streams = {s.name: s for s in t.streams()}
    assert streams["EVENTS"].storage is Storage.FILE
    assert streams["LIVE"].storage is Storage.MEMORY
    assert streams["LIVE"].max_age_seconds > 0
    assert streams["ACTIVATIONS"].retention is Retention.WORK_QUEUE


def test_a_namespace_prefixes_every_name() -> None:
    t = Topology(namespace="blue")
    assert t.event_subject("project", "p") == "blue.ev.project.p"
    assert t.events_stream == "BLUE_EVENTS"
    assert all(s.name.startswith("BLUE_") for s in t.streams())
    assert all(subj.startswith("blue.") for s in t.streams() for subj in s.subjects)
    assert t.parse_event_subject("blue.ev.project.p") == ("project", "p")


@pytest.mark.parametrize("bad", ["Blue", "1abc", "a.b", "a-b", "x" * 40])
def test_bad_namespaces_are_refused(bad: str) -> None:
    with pytest.raises(ValidationError):
        Topology(namespace=bad)


def test_parsing_a_foreign_subject_fails() -> None:
    with pytest.raises(ValueError, match="not an event subject"):
        DEFAULT_TOPOLOGY.parse_event_subject("live.session.s1")
