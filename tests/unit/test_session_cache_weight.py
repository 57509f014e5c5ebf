"""The session service's cache of aggregate states is bounded by the ids they hold, not only by
their number: a long session keeps one per message, signal and checkpoint for good, and
20,000 of them could hold hundreds of millions. The least recently used go first; the two used
last stay, however heavy: a command reads its aggregate, then another (a session, then its
project for the caller's role), and a session heavier than the whole budget, evicted by its
project's read, was read again whole by every command on it."""

from __future__ import annotations

from typing import cast

from suzumio.platform.bus.eventstore import EventStore
from suzumio.session.domain.session import SessionState
from suzumio.session.repository import Repository


def session(name: str, entries: int) -> SessionState:
    state = SessionState(name)
    state.version = 1
    state.entries = {f"{name}-m{i}": i for i in range(entries)}
    return state


def test_the_cache_lets_the_least_recently_used_go_past_its_weight() -> None:
    repo = Repository(cast("EventStore", None), cache_size=100, cache_weight=1_000)
    for name in ("a", "b", "c"):
        repo._keep(("session", name), session(name, 300))  # 301 each
    assert set(repo._cache) == {("session", n) for n in "abc"}
    repo._keep(("session", "d"), session("d", 300))  # 1,204 in all: the oldest goes
    assert set(repo._cache) == {("session", n) for n in "bcd"}

    grown = session("b", 900)  # kept again, grown: the older go, the two used last stay
    repo._keep(("session", "b"), grown)
    assert set(repo._cache) == {("session", "d"), ("session", "b")}
    huge = session("e", 5_000)  # over the bound alone: kept, being used, with the one before
    repo._keep(("session", "e"), huge)
    assert set(repo._cache) == {("session", "b"), ("session", "e")}
    assert repo._weight == grown.weight + huge.weight


def test_a_session_heavier_than_the_budget_outlives_its_projects_read() -> None:
    repo = Repository(cast("EventStore", None), cache_size=100, cache_weight=1_000)
    repo._keep(("session", "long"), session("long", 5_000))
    project = SessionState("p")  # any light aggregate read after it, as a project is
    project.version = 1
    repo._keep(("project", "p"), project)
    assert ("session", "long") in repo._cache
    repo._keep(("session", "next"), session("next", 10))  # a third: the oldest goes
    assert set(repo._cache) == {("project", "p"), ("session", "next")}
