"""Commands about users and API keys (owned by the session service)."""

from __future__ import annotations

from pydantic import Field

from suzumio.contracts.commands.base import Command, command
from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import Clean, Instant, Name

KeyId = str
Digest = str


@command("session", "bootstrap_admin")
class BootstrapAdmin(Command):
    """Create the first platform admin; refused once one exists. The caller made the key and
    sends only its digest."""

    name: Name = "admin"
    key_id: KeyId = Field(pattern=r"^[a-z0-9]{8,32}$")
    digest: Digest = Field(pattern=r"^[0-9a-f]{64}$")


@command("session", "create_user")
class CreateUser(Command):
    user_id: Identifier
    name: Name
    email: Clean | None = Field(default=None, max_length=320)
    admin: bool = False
    key_id: KeyId = Field(pattern=r"^[a-z0-9]{8,32}$")
    digest: Digest = Field(pattern=r"^[0-9a-f]{64}$")


@command("session", "create_api_key")
class CreateApiKey(Command):
    user_id: Identifier
    key_id: KeyId = Field(pattern=r"^[a-z0-9]{8,32}$")
    digest: Digest = Field(pattern=r"^[0-9a-f]{64}$")
    name: Clean = Field(default="", max_length=200)
    # Bounded as every instant from outside is: one that leaves the years 1..9999 once in UTC
    # could be appended but never projected, and would hold up every projection behind it.
    expires_at: Instant | None = None


@command("session", "revoke_api_key")
class RevokeApiKey(Command):
    user_id: Identifier
    key_id: KeyId


@command("session", "check_api_key")
class CheckApiKey(Command):
    """Whether a key is usable now, as the log has it (a read; only the platform asks): the
    gateway asks while the keys' read model is being rebuilt, whose frozen tables still show
    a key revoked since as usable. Answered with `result = {"usable": bool, "admin": bool}`."""

    user_id: Identifier
    key_id: KeyId
