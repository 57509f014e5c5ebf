"""The first platform admin: created once, its key shown once."""

from __future__ import annotations

import os
from pathlib import Path

from nats.aio.client import Client as NATS

from suzumio.contracts.commands import BootstrapAdmin
from suzumio.contracts.errors import ConflictError
from suzumio.contracts.subjects import Topology
from suzumio.platform import apikeys
from suzumio.platform.bus.commands import CommandClient

ADMIN_KEY_FILE = "admin.key"


async def bootstrap_admin(nc: NATS, topology: Topology, data_dir: Path | None) -> str | None:
    """Create the first admin; its API key, or None when the platform has one already.

    With `data_dir`, the key is also written to `<data_dir>/admin.key` (mode 0600) so a local
    installation can find it again.
    """
    key = apikeys.mint()
    client = CommandClient(nc, topology, timeout=30)
    try:
        await client.send(
            BootstrapAdmin(key_id=key.key_id, digest=key.digest), actor="system:bootstrap"
        )
    except ConflictError:
        return None
    if data_dir is not None:
        path = data_dir / ADMIN_KEY_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(key.plaintext + "\n")
    return key.plaintext
