"""Deadlines without a polling loop: one sleeper that wakes at the earliest of them."""

from __future__ import annotations

import heapq
from datetime import datetime


class Timers:
    def __init__(self) -> None:
        self._heap: list[tuple[datetime, str]] = []
        self._at: dict[str, datetime] = {}  # the earliest deadline per session

    def add(self, when: datetime, session_id: str) -> bool:
        """Look at `session_id` again at `when`; True when this is the new earliest deadline
        (the sleeper must wake sooner)."""
        known = self._at.get(session_id)
        if known is not None and known <= when:
            return False
        self._at[session_id] = when
        earliest = self._heap[0][0] if self._heap else None
        heapq.heappush(self._heap, (when, session_id))
        if len(self._heap) > 2 * len(self._at) + 64:
            # Entries no longer any session's earliest (a far deadline pushed again after
            # each nearer one fired) would pile up until their own time: only `_at` counts.
            self._heap = [(at, session) for session, at in self._at.items()]
            heapq.heapify(self._heap)
        return earliest is None or when < earliest

    def next_at(self) -> datetime | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: datetime) -> set[str]:
        due: set[str] = set()
        while self._heap and self._heap[0][0] <= now:
            when, session_id = heapq.heappop(self._heap)
            if self._at.get(session_id) == when:
                del self._at[session_id]
                due.add(session_id)
        return due

    def clear(self) -> None:
        self._heap.clear()
        self._at.clear()

    def __len__(self) -> int:
        return len(self._at)
