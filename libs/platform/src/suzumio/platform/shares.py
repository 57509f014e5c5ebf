"""How many of something each key holds at once — open model calls per activation, open
streams per user — for the limits a service sets on them.

A share is given back by the callable `take` returns, once: calling it again does nothing, so
every path that may end a holding (a stream's end, its response's end, an error) can call it.
"""

from __future__ import annotations

from collections.abc import Callable


class Shares:
    def __init__(self) -> None:
        self._held: dict[str, int] = {}

    def held(self, key: str) -> int:
        return self._held.get(key, 0)

    def take(self, key: str) -> Callable[[], None]:
        """One more share of `key`'s; what gives it back."""
        self._held[key] = self._held.get(key, 0) + 1
        given_back = False

        def give_back() -> None:
            nonlocal given_back
            if given_back:
                return
            given_back = True
            left = self._held.pop(key, 1) - 1
            if left > 0:
                self._held[key] = left

        return give_back
