"""Checking a host path for a mount grant against the allowlisted roots (host I/O)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from suzumio.contracts.errors import ForbiddenError, InvalidError


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def canonical_mount_path(path: str, roots: Sequence[Path], reserved: Sequence[Path] = ()) -> str:
    """The canonical form of `path` if it is an existing directory under an allowed root that
    shares nothing with a `reserved` directory.

    Symlinks are resolved before the check, so a link inside a root that points outside it
    is refused like any path outside. The reserved directories are the platform's own (its
    data directory, the sandboxes' directory): a sandbox given one of them, or a directory
    above or inside one, would see every activation's input with its token.
    """
    if not path.startswith("/"):
        raise InvalidError("a mount grant's host path must be absolute")
    if not roots:
        raise ForbiddenError("no mount roots are allowed here (SUZUMIO_MOUNT_ROOTS is empty)")
    real = os.path.realpath(path)
    allowed = [os.path.realpath(root) for root in roots]
    if not any(_inside(real, root) for root in allowed):
        raise ForbiddenError(f"{path} is outside the allowed mount roots", path=path)
    for own in (os.path.realpath(d) for d in reserved):
        if _inside(real, own) or _inside(own, real):
            raise ForbiddenError(
                f"{path} is, contains or is inside the platform's own data or sandboxes "
                "directory: it may not be mounted into a sandbox",
                path=path,
            )
    try:
        is_dir = Path(real).is_dir()
    except OSError as exc:  # a name too long, a directory we may not search: input, not a 500
        raise InvalidError(f"{path} cannot be checked: {exc.strerror}", path=path) from None
    if not is_dir:
        raise InvalidError(f"{path} is not an existing directory", path=path)
    return real
