"""Who is calling: an API key in `Authorization: Bearer ...` (or `X-API-Key`) → a user."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from suzumio.platform import apikeys
from suzumio.platform.db.pool import Pool

CACHE_SECONDS = 5.0  # a revoked key keeps working at most this long on a gateway


@dataclass(frozen=True)
class Principal:
    user_id: str
    admin: bool
    key_id: str

    @property
    def actor(self) -> str:
        return f"user:{self.user_id}"


@dataclass(frozen=True)
class _Entry:
    user_id: str
    admin: bool
    digest: str
    usable: bool
    expires_at: datetime | None
    fetched: float


KEYS_PROJECTION = "users"  # the read model the keys are read from (`proj_users`)
MAX_CACHED = 50_000

# Whether a key is usable, and its user an admin, as the log has it now.
Check = Callable[["Principal"], Awaitable[tuple[bool, bool]]]


class KeyCache:
    """Key id → stored digest and owner, read from the `users` projection, cached briefly."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._entries: dict[str, _Entry] = {}
        self._checked: dict[str, tuple[bool, bool, float]] = {}  # key id → `Check`'s, when
        self._flights: dict[str, asyncio.Future[tuple[bool, bool, float]]] = {}
        self._generations: dict[str, int] = {}  # key id → how often forgotten
        self._epoch = 0  # how often `_generations` was cleared

    async def _fetch(self, key_id: str) -> _Entry | None:
        row = await self._pool.fetchrow(
            "SELECT k.user_id, k.digest, k.revoked_at, k.expires_at, u.admin"
            " FROM proj_users.api_keys k JOIN proj_users.users u ON u.id = k.user_id"
            " WHERE k.key_id = $1",
            key_id,
        )
        if row is None:
            return None
        entry = _Entry(
            row["user_id"],
            row["admin"],
            row["digest"],
            row["revoked_at"] is None,
            row["expires_at"],
            time.monotonic(),
        )
        self._entries[key_id] = entry
        if len(self._entries) > MAX_CACHED:
            self._entries.clear()
        return entry

    async def principal(self, key: str, *, refresh: bool = False) -> Principal | None:
        parsed = apikeys.parse(key)
        if parsed is None:
            return None
        key_id, secret = parsed
        entry = self._entries.get(key_id)
        if refresh or entry is None or time.monotonic() - entry.fetched > CACHE_SECONDS:
            entry = await self._fetch(key_id)
        if entry is None or not entry.usable or not apikeys.matches(secret, entry.digest):
            return None
        if entry.expires_at is not None and entry.expires_at <= datetime.now(UTC):
            return None
        return Principal(entry.user_id, entry.admin, key_id)

    async def as_the_log_has_it(
        self, principal: Principal, check: Check, *, refresh: bool = False
    ) -> Principal | None:
        """`principal` (found in the read model) as the log has it now, for while the read
        model is frozen (being rebuilt): its tables still show a key revoked since as usable.
        Cached as the read model's answers are, so a revocation takes as long either way; one
        check at a time per key (the requests that come meanwhile wait for it, `refresh` ones
        too: it began at most one check's time ago)."""
        key_id = principal.key_id
        hit = self._checked.get(key_id)
        if refresh or hit is None or time.monotonic() - hit[2] > CACHE_SECONDS:
            flight = self._flights.get(key_id)
            if flight is None:
                generation = self._generation(key_id)  # now, not when it starts
                flight = asyncio.ensure_future(self._check(principal, check, generation))
                self._flights[key_id] = flight
                flight.add_done_callback(lambda done: self._landed(key_id, done))
            hit = await asyncio.shield(flight)
        usable, admin, _ = hit
        return Principal(principal.user_id, admin, key_id) if usable else None

    def _generation(self, key_id: str) -> tuple[int, int]:
        return self._epoch, self._generations.get(key_id, 0)

    async def _check(
        self, principal: Principal, check: Check, generation: tuple[int, int]
    ) -> tuple[bool, bool, float]:
        usable, admin = await check(principal)
        hit = (usable, admin, time.monotonic())
        # Kept only if the key was not forgotten meanwhile (revoked here): an answer begun
        # before the revocation would keep it working for the cache's time.
        if self._generation(principal.key_id) == generation:
            self._checked[principal.key_id] = hit
            if len(self._checked) > MAX_CACHED:
                self._checked.clear()
        return hit

    def _landed(self, key_id: str, flight: asyncio.Future[tuple[bool, bool, float]]) -> None:
        if self._flights.get(key_id) is flight:
            del self._flights[key_id]
        if not flight.cancelled():
            flight.exception()  # retrieved: each waiter has it raised already

    def forget(self, key_id: str) -> None:
        self._entries.pop(key_id, None)
        self._checked.pop(key_id, None)
        self._flights.pop(key_id, None)  # the next request checks afresh
        self._generations[key_id] = self._generations.get(key_id, 0) + 1
        if len(self._generations) > MAX_CACHED:
            # A new epoch: no check in flight (begun in the last one) is kept.
            self._generations.clear()
            self._epoch += 1
