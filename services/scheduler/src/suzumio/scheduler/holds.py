"""The leader's decisions in flight. A decision holds its session (and, for a start, the capacity
it takes) from its append until the fold reaches the version that append aims at; meanwhile the
session is not decided on again and the capacity counts as taken.

A hold belongs to the decision that took it. The fold may release it early (a newer fact
reached the session first, so that decision will be refused), and the session may then be
decided on again: the older decision's late answer, a conflict or an error, must not end the
newer one's hold, or the capacity it reserved is handed out twice."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from dataclasses import dataclass


@dataclass(eq=False)  # compared by identity: which decision owns the session
class Hold:
    target: int  # the session version at which the fold releases it
    capacity: tuple[str, str] | None = None  # (project, pool) a start takes until folded


class Holds:
    def __init__(self) -> None:
        self._by_session: dict[str, Hold] = {}
        self._landing: dict[str, asyncio.Event] = {}  # set when the session's hold ends
        # Capacity held by starts in flight, counted as holds come and go (asked for each
        # session waiting for admission: never a pass over every hold).
        self._in_project: Counter[str] = Counter()
        self._in_pool: Counter[str] = Counter()

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._by_session

    def owns(self, session_id: str, hold: Hold) -> bool:
        return self._by_session.get(session_id) is hold

    def take(self, session_id: str, target: int, capacity: tuple[str, str] | None = None) -> Hold:
        """A new decision's hold; the caller has seen the session unheld."""
        replaced = self._by_session.get(session_id)
        if replaced is not None:
            self._uncount(replaced)
        hold = self._by_session[session_id] = Hold(target, capacity)
        if capacity is not None:
            self._in_project[capacity[0]] += 1
            self._in_pool[capacity[1]] += 1
        return hold

    def free_capacity(self, hold: Hold) -> None:
        """The start `hold` was for will not be made as decided (its append was refused): it
        holds its session, not the capacity. (Through here: the counts must follow.)"""
        self._uncount(hold)
        hold.capacity = None

    def _uncount(self, hold: Hold) -> None:
        if hold.capacity is not None:
            project, pool = hold.capacity
            self._in_project[project] -= 1
            if self._in_project[project] <= 0:
                del self._in_project[project]
            self._in_pool[pool] -= 1
            if self._in_pool[pool] <= 0:
                del self._in_pool[pool]

    def release(self, session_id: str, hold: Hold) -> bool:
        """Ends `hold` if it still holds the session; False if another (or none) does."""
        if not self.owns(session_id, hold):
            return False
        del self._by_session[session_id]
        self._uncount(hold)
        landed = self._landing.pop(session_id, None)
        if landed is not None:
            landed.set()
        return True

    def reached(self, session_id: str, version: int) -> bool:
        """The fold reached `version` on the session: the hold aimed at it (or before) ends,
        whichever decision took it, as that decision is in or will be refused."""
        hold = self._by_session.get(session_id)
        return hold is not None and version >= hold.target and self.release(session_id, hold)

    def taken_in(self, project_id: str) -> int:
        """Capacity held by starts in flight in the project."""
        return self._in_project[project_id]

    def taken_in_pool(self, pool: str) -> int:
        """Capacity held by starts in flight in the pool."""
        return self._in_pool[pool]

    async def settled(self, session_id: str, seconds: float) -> bool:
        """Waits up to `seconds` until no decision holds the session; False if one still does.
        Each release wakes the waiters, who look again: a new decision may have taken the
        session before they ran."""
        deadline = asyncio.get_running_loop().time() + seconds
        while session_id in self._by_session:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return False
            landed = self._landing.setdefault(session_id, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(landed.wait(), left)
        return True
