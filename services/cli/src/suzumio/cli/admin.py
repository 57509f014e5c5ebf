"""The first platform admin: created once, its key shown once.

Only one admin can ever be bootstrapped and no other command issues an admin key, so a key
the platform accepted but nobody kept is lost for good. With a data directory the key is
therefore saved before the command goes out: once sent it may be applied whatever becomes of
us (Ctrl-C, SIGKILL, a reply that never comes).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from nats.aio.client import Client as NATS
from pydantic import ValidationError

from suzumio.contracts.commands import BootstrapAdmin
from suzumio.contracts.errors import CommandTimeoutError, ConflictError
from suzumio.contracts.subjects import Topology
from suzumio.platform import apikeys
from suzumio.platform.apikeys import MintedKey
from suzumio.platform.bus.commands import CommandClient

ADMIN_KEY_FILE = "admin.key"
_WHERE = " (SUZUMIO_DATA_DIR names the data directory, which must be writable)"
BOOTSTRAP_TIMEOUT = 30.0  # seconds; a session service still migrating may be slow to answer


class AdminUnconfirmedError(CommandTimeoutError):
    """BootstrapAdmin went out and no answer came back: the session service may still apply
    it, and then `key` is the admin's (kept off the message, which may be logged)."""

    def __init__(self, cause: CommandTimeoutError, key: str) -> None:
        super().__init__(cause.message, **cause.details)
        self.key = key


class KeyFileError(Exception):
    """`admin.key` cannot be read or written, or holds something other than a key."""


async def bootstrap_admin(nc: NATS, topology: Topology, data_dir: Path | None) -> str | None:
    """Create the first admin; its API key, or None when the platform has one already.

    With `data_dir`, the key is kept in `<data_dir>/admin.key` (mode 0600), written before the
    command is sent. A key found there already is sent again rather than replaced: an earlier
    run may have had it applied without hearing so.

    Raises:
        AdminUnconfirmedError: no answer in time (the key stays saved).
        KeyFileError: the key could not be kept, so the command was not sent.
        CommandError: any other refusal, e.g. no session service answering.
    """
    path = data_dir / ADMIN_KEY_FILE if data_dir is not None else None
    saved = _saved(path) if path is not None else None
    key = saved or apikeys.mint()
    command = BootstrapAdmin(key_id=key.key_id, digest=key.digest)
    if path is not None and saved is None:
        _save(path, key.plaintext)
    client = CommandClient(nc, topology, timeout=BOOTSTRAP_TIMEOUT)
    try:
        await client.send(command, actor="system:bootstrap")
    except ConflictError:
        # Someone else's admin: ours can never be applied. A key found saved stays, it may
        # be that admin's.
        if path is not None and saved is None:
            path.unlink(missing_ok=True)
        return None
    except CommandTimeoutError as exc:
        raise AdminUnconfirmedError(exc, key.plaintext) from exc
    return key.plaintext


def _saved(path: Path) -> MintedKey | None:
    """The key an earlier run saved at `path`, or None when there is no file."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise KeyFileError(f"{path} holds no API key (it is not text); move it away") from exc
    except OSError as exc:
        raise KeyFileError(f"cannot read {path}: {exc.strerror or exc}{_WHERE}") from exc
    key = _as_key(text)
    if key is None:
        # Never overwritten: it may be the only copy of something someone needs.
        raise KeyFileError(f"{path} holds no API key; move it away to have a new one made")
    return key


def _as_key(text: str) -> MintedKey | None:
    parsed = apikeys.parse(text)
    if parsed is None:
        return None
    key = MintedKey(text, parsed[0], apikeys.digest(parsed[1]))
    try:
        BootstrapAdmin(key_id=key.key_id, digest=key.digest)  # what the command takes
    except ValidationError:
        return None
    return key


def _save(path: Path, text: str) -> None:
    """Write `text` to `path` (mode 0600) so that a crash leaves the whole key or no file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            Path(temp).replace(path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a power cut
        finally:
            os.close(directory)
    except OSError as exc:
        raise KeyFileError(
            f"cannot save the admin key in {path}: {exc.strerror or exc}{_WHERE}"
        ) from exc
