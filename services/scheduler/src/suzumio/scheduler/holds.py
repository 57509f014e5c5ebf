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
from dataclasses import dataclass


@dataclass(eq=False)  # compared by identity: which decision owns the session
class Hold:
    target: int  # the session version at which the fold releases it
    capacity: tuple[str, str] | None = None  # (project, pool) a start takes until folded


class Holds:
    def __init__(self) -> None:
        self._by_session: dict[str, Hold] = {}
        self._landing: dict[str, asyncio.Event] = {}  # set when the session's hold ends

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._by_session

    def owns(self, session_id: str, hold: Hold) -> bool:
        return self._by_session.get(session_id) is hold

    def take(self, session_id: str, target: int, capacity: tuple[str, str] | None = None) -> Hold:
        """A new decision's hold; the caller has seen the session unheld."""
        hold = self._by_session[session_id] = Hold(target, capacity)
        return hold

    def release(self, session_id: str, hold: Hold) -> bool:
        """Ends `hold` if it still holds the session; False if another (or none) does."""
        if not self.owns(session_id, hold):
            return False
        del self._by_session[session_id]
        landed = self._landing.pop(session_id, None)
        if landed is not None:
            landed.set()
        return True

    def reached(self, session_id: str, version: int) -> bool:
        """The fold reached `version` on the session: the hold aimed at it (or before) ends,
        whichever decision took it, as that decision is in or will be refused."""
        hold = self._by_session.get(session_id)
        return hold is not None and version >= hold.target and self.release(session_id, hold)

    def taken(self, project_id: str, pool: str) -> tuple[int, int]:
        """Capacity held by starts in flight: (in the project, in the pool)."""
        held = [h.capacity for h in self._by_session.values() if h.capacity is not None]
        return sum(1 for p, _ in held if p == project_id), sum(1 for _, q in held if q == pool)

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
