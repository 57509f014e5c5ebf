"""API keys: `szm_<key id>_<secret>`. Only SHA-256 of the secret is ever stored.

The secret is 256 random bits, so a fast hash is enough (nothing to brute-force); the key id
finds the stored digest without scanning.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import string
from dataclasses import dataclass

PREFIX = "szm"
_ALPHABET = string.ascii_lowercase + string.digits
# What a key id can be (the commands' own pattern): anything else names no key, and must not
# reach a lookup (a NUL, say, which a database text parameter cannot even hold: a 500).
_KEY_ID = re.compile(r"[a-z0-9]{8,32}")


@dataclass(frozen=True)
class MintedKey:
    plaintext: str  # shown once to whoever asked for it; never stored
    key_id: str
    digest: str


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def mint() -> MintedKey:
    key_id = "".join(secrets.choice(_ALPHABET) for _ in range(12))
    secret = secrets.token_urlsafe(32)
    return MintedKey(f"{PREFIX}_{key_id}_{secret}", key_id, digest(secret))


def parse(text: str) -> tuple[str, str] | None:
    """(key id, secret) of a well-formed key, else None."""
    parts = text.strip().split("_", 2)
    if len(parts) != 3 or parts[0] != PREFIX or len(parts[2]) < 16:
        return None
    if _KEY_ID.fullmatch(parts[1]) is None:
        return None
    return parts[1], parts[2]


def matches(secret: str, stored_digest: str) -> bool:
    return hmac.compare_digest(digest(secret), stored_digest)
