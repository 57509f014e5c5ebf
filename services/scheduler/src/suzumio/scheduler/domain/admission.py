"""Who may start next when capacity is short: round-robin across projects, and within a
project the sessions in the order they asked."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from itertools import count

Fits = Callable[[str, str], bool]  # (project id, session id) -> would its start fit now
Room = Callable[[str], bool]  # project id -> has it room for one more start at all
PoolRoom = Callable[[str], bool]  # pool -> has it room for one more start at all


class Admission:
    def __init__(self) -> None:
        # project -> pool -> the sessions waiting (each with its turn: the order they asked).
        self._waiting: OrderedDict[str, dict[str, OrderedDict[str, int]]] = OrderedDict()
        self._where: dict[str, tuple[str, str]] = {}  # session -> (project, pool)
        self._turns = count()

    def want(self, project_id: str, session_id: str, pool: str = "") -> None:
        """The session would start an activation on `pool`; it waits its turn (the one it
        has if it waits already, on that pool or another)."""
        where = (project_id, pool)
        was = self._where.get(session_id)
        if was == where:
            return
        if was is None:
            self._file(session_id, where, next(self._turns))
        else:  # its agent moved to another pool (or project) meanwhile
            self._file(session_id, where, self._drop(session_id, *was))

    def refile(self, pool_of: Callable[[str], str]) -> None:
        """Every waiting session on the pool it would start on now (agents and runtime
        profiles changed): filed under a full pool it left, it waited for that one."""
        for session_id, (project_id, pool) in list(self._where.items()):
            now = pool_of(session_id)
            if now != pool:
                self.want(project_id, session_id, now)

    def waiting(self) -> int:
        return len(self._where)

    def clear(self) -> None:
        self._waiting.clear()
        self._where.clear()

    def admit(self, fits: Fits, room: Room, pool_room: PoolRoom = lambda _: True) -> Iterator[str]:
        """Sessions to start now, one project after another. `fits` is asked again after
        each start (the caller counts it), so limits hold however many are waiting. A
        project without `room`, and a pool without `pool_room`, are passed over whole: a
        batch of thousands of sessions waiting behind a limit costs nothing per decision
        (asking each of them, after each start anywhere, held the event loop for seconds)."""
        while True:
            progressed = False
            for project_id in list(self._waiting):
                if not room(project_id):
                    continue
                chosen = self._first_fitting(project_id, fits, pool_room)
                if chosen is not None:
                    self._drop(chosen, *self._where.pop(chosen))
                    if project_id in self._waiting:
                        self._waiting.move_to_end(project_id)  # the others go first next time
                    progressed = True
                    yield chosen
            if not progressed:
                return

    def _first_fitting(self, project_id: str, fits: Fits, pool_room: PoolRoom) -> str | None:
        """The project's session that asked first among those whose start fits."""
        best: tuple[int, str] | None = None
        for pool, sessions in self._waiting[project_id].items():
            if not pool_room(pool):
                continue
            for session_id, turn in sessions.items():
                if best is not None and turn > best[0]:
                    break  # the rest of this pool asked later still
                if fits(project_id, session_id):
                    best = (turn, session_id)
                    break
        return best[1] if best is not None else None

    def _file(self, session_id: str, where: tuple[str, str], turn: int) -> None:
        self._where[session_id] = where
        project_id, pool = where
        sessions = self._waiting.setdefault(project_id, {}).setdefault(pool, OrderedDict())
        last = next(reversed(sessions.values()), -1)
        sessions[session_id] = turn
        if turn < last:  # an earlier turn, moved here: the pool's order is by turn
            ordered = sorted(sessions.items(), key=lambda item: item[1])
            sessions.clear()
            sessions.update(ordered)

    def _drop(self, session_id: str, project_id: str, pool: str) -> int:
        pools = self._waiting[project_id]
        turn = pools[pool].pop(session_id)
        if not pools[pool]:
            del pools[pool]
        if not pools:
            del self._waiting[project_id]
        return turn
