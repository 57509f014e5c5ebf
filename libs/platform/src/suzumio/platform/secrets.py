"""Sealing secrets (provider keys) with the platform's secret key.

Secrets are stored in the log only sealed (Fernet: AES-128-CBC + HMAC-SHA256, authenticated).
`SUZUMIO_SECRET_KEY` holds one or more Fernet keys separated by commas, the first one current:
sealing uses it, opening tries them all, so a new key can be rolled in before old secrets are
re-sealed. Without the variable, a key is generated once into `<data_dir>/secret.key` (0600).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from suzumio.contracts.values import EncryptedSecret
from suzumio.platform.settings import PlatformSettings

KEY_FILE = "secret.key"


class SecretError(RuntimeError):
    pass


def key_id(key: str) -> str:
    """A short, non-reversible name for a key (to know which key sealed what)."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class SecretBox:
    def __init__(self, keys: Sequence[str]) -> None:
        if not keys:
            raise SecretError("no secret key configured")
        try:
            self._fernets = [Fernet(k.encode()) for k in keys]
        except ValueError as exc:
            raise SecretError("a secret key is not a valid Fernet key") from exc
        self._multi = MultiFernet(self._fernets)
        self.current_key_id = key_id(keys[0])

    @staticmethod
    def generate_key() -> str:
        return Fernet.generate_key().decode()

    def seal(self, plaintext: str) -> EncryptedSecret:
        token = self._fernets[0].encrypt(plaintext.encode()).decode()
        return EncryptedSecret(ciphertext=token, key_id=self.current_key_id)

    def open(self, secret: EncryptedSecret) -> str:
        try:
            return self._multi.decrypt(secret.ciphertext.encode()).decode()
        except InvalidToken as exc:
            raise SecretError("the secret cannot be opened with the configured keys") from exc

    def seal_bytes(self, data: bytes) -> bytes:
        return self._fernets[0].encrypt(data)

    def open_bytes(self, token: bytes) -> bytes:
        try:
            return self._multi.decrypt(token)
        except InvalidToken as exc:
            raise SecretError("the data cannot be opened with the configured keys") from exc

    def reseal(self, secret: EncryptedSecret) -> EncryptedSecret:
        """The same secret sealed with the current key (for key rotation)."""
        if secret.key_id == self.current_key_id:
            return secret
        token = self._multi.rotate(secret.ciphertext.encode()).decode()
        return EncryptedSecret(ciphertext=token, key_id=self.current_key_id)


def secret_keys(settings: PlatformSettings) -> list[str]:
    """The configured keys, or the data directory's key file (created on first use)."""
    if settings.secret_key is not None:
        return [k.strip() for k in settings.secret_key.get_secret_value().split(",") if k.strip()]
    path = Path(settings.data_dir) / KEY_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{KEY_FILE}.{os.getpid()}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(SecretBox.generate_key() + "\n")
        try:  # whoever links first wins; a racing process reads the winner's key
            os.link(temporary, path)
        except FileExistsError:
            pass
        finally:
            temporary.unlink()
    return [path.read_text().strip()]


def secret_box(settings: PlatformSettings) -> SecretBox:
    return SecretBox(secret_keys(settings))
