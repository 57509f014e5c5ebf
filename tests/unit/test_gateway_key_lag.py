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
from suzumio.gateway.api.problems import ApiError

WELL_FORMED = "szm_abcdefgh_" + "s" * 32


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

    def serving(self, projection: str) -> bool:  # noqa: ARG002
        return True

    async def first_read(self, timeout: float) -> bool:  # noqa: ARG002
        return True


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
    principal = await authenticate(gw, WELL_FORMED)  # type: ignore[arg-type]
    assert principal.user_id == "u"
    assert keys.lookups == 2


@pytest.mark.parametrize(
    "key", ["hello", "szm_key", "szm_UPPER123_" + "s" * 32, "szm_abcdefgh_short"]
)
async def test_a_key_no_read_model_could_hold_is_refused_at_once_however_far_it_lags(
    monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    """A key that is not even of the form the platform mints is a 401 straight away: not a
    503 "catching up, try again" while the keys' read model lags — which told a client with
    a mistyped key to retry — nor a look at the log's end for each such request."""
    positions = Positions()

    class Lagging:
        async def principal(self, key: str, *, refresh: bool = False) -> Any:  # noqa: ARG002
            return None

    async def wait_for(position: int, timeout: float, projection: str) -> bool:  # noqa: ARG001
        return False  # never catches up

    async def log_end(_: object) -> int:
        raise AssertionError("a malformed key needs no look at the log")

    monkeypatch.setattr(positions, "wait_for", wait_for)
    monkeypatch.setattr(deps, "_log_end", log_end)
    gw = SimpleNamespace(
        keys=Lagging(), positions=positions, settings=SimpleNamespace(read_your_writes_timeout=1.0)
    )
    with pytest.raises(ApiError) as refused:
        await authenticate(gw, key)  # type: ignore[arg-type]
    assert refused.value.status == 401
