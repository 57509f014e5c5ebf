"""Events of the `user` aggregate: people and programs that call the API, and their keys."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from suzumio.contracts.envelope import DomainEvent, event
from suzumio.contracts.values import Name


@event("user.created")
class UserCreated(DomainEvent):
    name: Name
    email: str | None = Field(default=None, max_length=320)
    admin: bool = False


@event("user.api_key_created")
class ApiKeyCreated(DomainEvent):
    """Only a SHA-256 digest of the key's secret part is kept; the key itself is shown once."""

    key_id: str = Field(pattern=r"^[a-z0-9]{8,32}$")
    name: str = Field(default="", max_length=200)
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    expires_at: datetime | None = None


@event("user.api_key_revoked")
class ApiKeyRevoked(DomainEvent):
    key_id: str
