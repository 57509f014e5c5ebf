"""Who may start next when capacity is short: round-robin across projects, and within a
project the sessions in the order they asked."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator

Fits = Callable[[str, str], bool]  # (project id, session id) -> would its start fit now
Room = Callable[[str], bool]  # project id -> has it room for one more start at all


class Admission:
    def __init__(self) -> None:
        self._waiting: OrderedDict[str, OrderedDict[str, None]] = OrderedDict()

    def want(self, project_id: str, session_id: str) -> None:
        """The session would start an activation; it waits its turn."""
        self._waiting.setdefault(project_id, OrderedDict())[session_id] = None

    def waiting(self) -> int:
        return sum(len(sessions) for sessions in self._waiting.values())

    def clear(self) -> None:
        self._waiting.clear()

    def admit(self, fits: Fits, room: Room) -> Iterator[str]:
        """Sessions to start now, one project after another. `fits` is asked again after
        each start (the caller counts it), so limits hold however many are waiting. A
        project without `room` is passed over whole: a batch of thousands of sessions
        waiting behind its limit costs nothing per decision (asking each of them, after each
        start anywhere, held the event loop for seconds)."""
        while True:
            progressed = False
            for project_id in list(self._waiting):
                sessions = self._waiting[project_id]
                if not room(project_id):
                    continue
                chosen = next((sid for sid in sessions if fits(project_id, sid)), None)
                if chosen is not None:
                    del sessions[chosen]
                    self._waiting.move_to_end(project_id)  # the others go first next time
                    progressed = True
                    yield chosen
                if not sessions:
                    self._waiting.pop(project_id, None)
            if not progressed:
                return
