"""Who is calling: an API key in `Authorization: Bearer ...` (or `X-API-Key`) → a user."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from suzumio.gateway.api.log_checks import LogChecks
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
        self._checks: LogChecks[str, tuple[bool, bool]] = LogChecks(CACHE_SECONDS)

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
        model is frozen: its tables still show a key revoked since as usable (`LogChecks`:
        cached as the read model's answers are, one check per key at a time)."""
        usable, admin = await self._checks.get(
            principal.key_id, lambda: check(principal), refresh=refresh
        )
        return Principal(principal.user_id, admin, principal.key_id) if usable else None

    def forget(self, key_id: str) -> None:
        self._entries.pop(key_id, None)
        self._checks.forget(key_id)
