"""The user aggregate: a name, the admin flag, and API key digests."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import ClassVar

from suzumio.contracts.commands import BootstrapAdmin, CreateApiKey, CreateUser, RevokeApiKey
from suzumio.contracts.envelope import DomainEvent
from suzumio.contracts.errors import ConflictError, NotFoundError, id_taken
from suzumio.contracts.events import ApiKeyCreated, ApiKeyRevoked, UserCreated
from suzumio.session.domain.state import AggregateState

BOOTSTRAP_ADMIN_ID = "admin"  # a fixed id: the conditional append makes bootstrap happen once
MAX_KEYS = 100


@dataclass
class Key:
    key_id: str
    revoked: bool = False
    expires_at: datetime | None = None


class UserState(AggregateState):
    aggregate: ClassVar[str] = "user"

    def __init__(self, aggregate_id: str) -> None:
        super().__init__(aggregate_id)
        self.name = ""
        self.admin = False
        self.keys: dict[str, Key] = {}

    def apply(self, data: DomainEvent) -> None:
        match data:
            case UserCreated():
                self.name, self.admin = data.name, data.admin
            case ApiKeyCreated():
                self.keys[data.key_id] = Key(data.key_id, expires_at=data.expires_at)
            case ApiKeyRevoked():
                self.keys[data.key_id].revoked = True


def _first_key(key_id: str, digest: str) -> ApiKeyCreated:
    return ApiKeyCreated(key_id=key_id, name="first key", digest=digest)


def bootstrap(state: UserState, cmd: BootstrapAdmin) -> list[DomainEvent]:
    if state.exists:
        raise ConflictError("the platform has its first admin already")
    return [UserCreated(name=cmd.name, admin=True), _first_key(cmd.key_id, cmd.digest)]


def create(state: UserState, cmd: CreateUser) -> list[DomainEvent]:
    if state.exists:
        raise id_taken("a user")
    created = UserCreated(name=cmd.name, email=cmd.email, admin=cmd.admin)
    return [created, _first_key(cmd.key_id, cmd.digest)]


def create_key(state: UserState, cmd: CreateApiKey, now: datetime) -> list[DomainEvent]:
    if cmd.key_id in state.keys:
        raise id_taken("a key")
    # An expired key no longer opens anything: it must not hold a place among the active.
    active = [k for k in state.keys.values() if not k.revoked and not _expired(k, now)]
    if len(active) >= MAX_KEYS:
        raise ConflictError(f"a user has at most {MAX_KEYS} active keys")
    return [
        ApiKeyCreated(
            key_id=cmd.key_id, name=cmd.name, digest=cmd.digest, expires_at=cmd.expires_at
        )
    ]


def usable(state: UserState, key_id: str, now: datetime) -> bool:
    """Whether the key opens the API now: the user's, not revoked, not expired."""
    key = state.keys.get(key_id)
    return key is not None and not key.revoked and not _expired(key, now)


def _expired(key: Key, now: datetime) -> bool:
    at = key.expires_at
    if at is None:
        return False
    # Naive in events from before the API refused that: UTC, as the read models take it.
    return (at if at.tzinfo else at.replace(tzinfo=UTC)) <= now


def revoke_key(state: UserState, cmd: RevokeApiKey) -> list[DomainEvent]:
    key = state.keys.get(cmd.key_id)
    if key is None:
        raise NotFoundError("API key not found")
    return [] if key.revoked else [ApiKeyRevoked(key_id=cmd.key_id)]
