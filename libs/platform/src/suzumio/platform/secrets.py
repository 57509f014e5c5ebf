"""Sealing secrets (provider keys) with the platform's secret key.

Secrets are stored in the log only sealed (Fernet: AES-128-CBC + HMAC-SHA256, authenticated).
`SUZUMIO_SECRET_KEY` holds one or more Fernet keys separated by commas, the first one current:
sealing uses it, opening tries them all, so a new key can be rolled in before old secrets are
re-sealed. Without the variable, a key is generated once into `<data_dir>/secret.key` (0600).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
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
        """The same secret sealed with the current key (for key rotation).

        Raises:
            SecretError: none of the configured keys opens it.
        """
        if secret.key_id == self.current_key_id:
            return secret
        try:
            token = self._multi.rotate(secret.ciphertext.encode()).decode()
        except InvalidToken as exc:
            raise SecretError("the secret cannot be opened with the configured keys") from exc
        return EncryptedSecret(ciphertext=token, key_id=self.current_key_id)


def secret_keys(settings: PlatformSettings) -> list[str]:
    """The configured keys, or the data directory's key file (created on first use)."""
    if settings.secret_key is not None:
        return [k.strip() for k in settings.secret_key.get_secret_value().split(",") if k.strip()]
    path = Path(settings.data_dir) / KEY_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # A name of its own (not the pid: processes of two containers sharing the directory
        # may both be pid 1, and would write, link and unlink one another's file).
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{KEY_FILE}.")  # mode 0600
        temporary = Path(name)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(SecretBox.generate_key() + "\n")
                # On disk before it is linked: after a power cut, an empty key file would
                # stop every service, and a new key would make every sealed secret unreadable.
                handle.flush()
                os.fsync(handle.fileno())
            # whoever links first wins; a racing process reads the winner's key
            with contextlib.suppress(FileExistsError):
                os.link(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # and so is the link
        finally:
            os.close(directory)
    return [path.read_text().strip()]


def secret_box(settings: PlatformSettings) -> SecretBox:
    return SecretBox(secret_keys(settings))
