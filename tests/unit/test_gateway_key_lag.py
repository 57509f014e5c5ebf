"""A key stored while the gateway looked it up is never refused as invalid (`authenticate`).
The read model's timing is scripted here — the keys' read model and its position are
stand-ins, and the log's end is given — to hit the window a real stack hits only now and
then: the projector storing the key after the lookup missed it, before the position was
read. (The whole path, on the real services, is `tests/e2e`.)"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from suzumio.gateway.api import deps
from suzumio.gateway.api.deps import authenticate


class Keys:
    """Misses the key on the first lookup, and the projector stores it just after."""

    def __init__(self, positions: Positions) -> None:
        self.positions = positions
        self.lookups = 0

    async def principal(self, key: str, *, refresh: bool = False) -> Any:  # noqa: ARG002
        self.lookups += 1
        if self.lookups == 1:
            self.positions.value = 10  # stored as the lookup came back empty
            return None
        return SimpleNamespace(user_id="u", key=key)


class Positions:
    def __init__(self) -> None:
        self.value = 9

    def position_of(self, projection: str) -> int:  # noqa: ARG002
        return self.value

    async def wait_for(self, position: int, timeout: float, projection: str) -> bool:  # noqa: ARG002
        return self.value >= position


async def test_a_key_stored_during_its_lookup_is_found_not_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    positions = Positions()
    keys = Keys(positions)
    gw = SimpleNamespace(
        keys=keys, positions=positions, settings=SimpleNamespace(read_your_writes_timeout=1.0)
    )

    async def log_end(_: object) -> int:
        return 10

    monkeypatch.setattr(deps, "_log_end", log_end)
    principal = await authenticate(gw, "szm_key")  # type: ignore[arg-type]
    assert principal.user_id == "u"
    assert keys.lookups == 2
