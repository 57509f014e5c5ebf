"""Checking a host path for a mount grant against the allowlisted roots (host I/O)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from suzumio.contracts.errors import ForbiddenError, InvalidError


def canonical_mount_path(path: str, roots: Sequence[Path]) -> str:
    """The canonical form of `path` if it is an existing directory under an allowed root.

    Symlinks are resolved before the check, so a link inside a root that points outside it
    is refused like any path outside.
    """
    if not path.startswith("/"):
        raise InvalidError("a mount grant's host path must be absolute")
    if not roots:
        raise ForbiddenError("no mount roots are allowed here (SUZUMIO_MOUNT_ROOTS is empty)")
    real = os.path.realpath(path)
    allowed = [os.path.realpath(root) for root in roots]
    if not any(real == root or real.startswith(root.rstrip("/") + "/") for root in allowed):
        raise ForbiddenError(f"{path} is outside the allowed mount roots", path=path)
    if not Path(real).is_dir():
        raise InvalidError(f"{path} is not an existing directory", path=path)
    return real
