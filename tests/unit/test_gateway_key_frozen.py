"""Keys while their read model is frozen (`authenticate`, `KeyCache.as_the_log_has_it`): the
read model, its positions and the session service's answers are stand-ins here, to script
what a real stack shows only mid-upgrade — a check that fails, one in flight while the key
is revoked, requests that come together. (The whole path, on the real services, is
`tests/e2e/test_keys_while_rebuilt.py`.)"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from suzumio.contracts.errors import InvalidError
from suzumio.gateway.api import deps
from suzumio.gateway.api.auth import KeyCache, Principal
from suzumio.gateway.api.deps import authenticate
from suzumio.gateway.api.log_checks import LogChecks
from suzumio.gateway.api.problems import ApiError

WELL_FORMED = "szm_abcdefgh_" + "s" * 32
FOUND = Principal("u", admin=True, key_id="abcdefgh")


class Frozen:
    """The keys' read model as a rebuild leaves it: read, not serving, not moving."""

    def position_of(self, projection: str) -> int:  # noqa: ARG002
        return 9

    def serving(self, projection: str) -> bool:  # noqa: ARG002
        return False

    async def first_read(self, timeout: float) -> bool:  # noqa: ARG002
        return True

    async def wait_for(self, position: int, timeout: float, projection: str) -> bool:  # noqa: ARG002
        return False


class Keys(KeyCache):
    """The read model's lookup answers `found`; the log's checks are the real cache's."""

    def __init__(self, found: Principal | None) -> None:
        super().__init__(pool=None)  # type: ignore[arg-type]
        self.found = found

    async def principal(self, key: str, *, refresh: bool = False) -> Any:  # noqa: ARG002
        return self.found


class Commands:
    def __init__(self, answer: dict[str, Any] | Exception) -> None:
        self.answer = answer
        self.sent = 0

    async def send(self, command: object, *, actor: str, timeout: float) -> Any:  # noqa: ARG002
        self.sent += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return SimpleNamespace(result=self.answer)


def gateway(found: Principal | None, answer: dict[str, Any] | Exception) -> Any:
    return SimpleNamespace(
        keys=Keys(found),
        positions=Frozen(),
        commands=Commands(answer),
        settings=SimpleNamespace(read_your_writes_timeout=1.0, command_timeout=10.0),
    )


@pytest.fixture(autouse=True)
def _log_end(monkeypatch: pytest.MonkeyPatch) -> None:
    async def end(_: object) -> int:
        return 10

    monkeypatch.setattr(deps, "_log_end", end)


async def test_the_log_decides_and_its_admin_flag_is_the_one_taken() -> None:
    gw = gateway(FOUND, {"usable": True, "admin": False})
    assert await authenticate(gw, WELL_FORMED) == Principal("u", admin=False, key_id="abcdefgh")
    gw = gateway(FOUND, {"usable": False, "admin": False})
    with pytest.raises(ApiError) as refused:
        await authenticate(gw, WELL_FORMED)
    assert refused.value.status == 401


async def test_a_check_the_session_service_refuses_is_a_503_not_the_callers_fault() -> None:
    """A session service of a release without the command answers `invalid` (mid-upgrade,
    the only time the check is made): it reached the client as a 422, which it would not
    retry."""
    gw = gateway(FOUND, InvalidError("unknown command session.check_api_key"))
    with pytest.raises(ApiError) as unavailable:
        await authenticate(gw, WELL_FORMED)
    assert unavailable.value.status == 503
    assert unavailable.value.headers == {"Retry-After": "1"}


async def test_requests_that_come_together_make_one_check() -> None:
    cache = KeyCache(pool=None)  # type: ignore[arg-type]
    calls = 0
    go = asyncio.Event()

    async def check(_: Principal) -> tuple[bool, bool]:
        nonlocal calls
        calls += 1
        await go.wait()
        return True, False

    waiting = [asyncio.ensure_future(cache.as_the_log_has_it(FOUND, check)) for _ in range(5)]
    await asyncio.sleep(0)
    go.set()
    assert {p.key_id for p in await asyncio.gather(*waiting) if p is not None} == {"abcdefgh"}
    assert calls == 1


async def test_a_check_in_flight_when_the_key_is_revoked_here_is_not_kept() -> None:
    """Begun before the revocation, its `usable` answer was cached: the key went on working
    for the cache's time on the gateway that revoked it, which the API says stops at once."""
    cache = KeyCache(pool=None)  # type: ignore[arg-type]
    answers = [(True, False), (False, False)]
    release = asyncio.Event()

    async def check(_: Principal) -> tuple[bool, bool]:
        answer = answers.pop(0)
        if answers:  # the first one waits until the key is revoked
            await release.wait()
        return answer

    before = asyncio.ensure_future(cache.as_the_log_has_it(FOUND, check))
    await asyncio.sleep(0)
    cache.forget(FOUND.key_id)  # revoked through this gateway
    release.set()
    assert await before is not None  # asked before the revocation
    assert await cache.as_the_log_has_it(FOUND, check) is None


async def test_a_failed_check_reaches_every_waiter_and_is_not_kept() -> None:
    checks: LogChecks[str, bool] = LogChecks(60.0)
    asked = 0
    go = asyncio.Event()

    async def ask() -> bool:
        nonlocal asked
        asked += 1
        await go.wait()
        if asked == 1:
            raise ApiError(503, "the session service did not answer")
        return True

    waiting = [asyncio.ensure_future(checks.get("k", ask)) for _ in range(3)]
    await asyncio.sleep(0)
    go.set()
    outcomes = await asyncio.gather(*waiting, return_exceptions=True)
    assert [type(o) for o in outcomes] == [ApiError] * 3
    assert await checks.get("k", ask) is True  # asked again, not the failure kept
    assert asked == 2
