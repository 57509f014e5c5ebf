"""The session service's cache of aggregate states is bounded by the ids they hold, not only by
their number: a long session keeps one per message, signal and checkpoint for good, and
20,000 of them could hold hundreds of millions. The least recently used go first; the one just
kept stays, however heavy (it is in use)."""

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

    grown = session("b", 900)  # kept again, grown: the others go, it stays
    repo._keep(("session", "b"), grown)
    assert set(repo._cache) == {("session", "b")}
    huge = session("e", 5_000)  # over the bound alone: kept, being used
    repo._keep(("session", "e"), huge)
    assert set(repo._cache) == {("session", "e")}
    assert repo._weight == huge.weight
