"""The agent package's assets in `<workspace>/assets`, fetched through the tool-broker before the
loop on every backend (the same way wherever the sandbox runs: a process, a container, a
Kubernetes Job or a pool worker's warm workspace).

The directory is the package's, not the agent's: whatever else is in it (left by an earlier
activation in a warm workspace, or an asset the package no longer has) is removed, a file
that is not the asset's bytes any more is fetched again, and the assets are made read-only —
a hint, not a wall: the agent owns its workspace. The session's own files (`in/`, `out/`,
`session/`) are elsewhere, so an asset never takes the place of one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from functools import partial
from pathlib import Path

from suzumio.contracts.runner import ASSETS_DIR, FileRef
from suzumio.runner.broker import BrokerClient, BrokerError, BrokerUnavailableError, FencedError
from suzumio.runner.log import log
from suzumio.runner.workfiles import ExchangeError, place, remove_tree

READ_ONLY = 0o444


async def bring_assets(broker: BrokerClient, workspace: Path, assets: tuple[FileRef, ...]) -> None:
    """Each asset at its path under `workspace/assets`, and nothing else there.

    Raises:
        ExchangeError: an asset could not be fetched or written.
        FencedError, BrokerUnavailableError: as any broker call.
    """
    root = workspace / ASSETS_DIR
    # Most agents have no assets: one lstat on the loop, not a thread handed work every
    # activation; the pruning of a tree left there (it may be large) goes off the loop.
    if assets or os.path.lexists(root):  # noqa: ASYNC240
        await asyncio.to_thread(prune, root, assets)
    for ref in assets:
        try:
            await place(root, ref, partial(broker.download_asset, ref))
            _read_only(root / ref.path)
        except (FencedError, BrokerUnavailableError):
            raise
        except (BrokerError, ExchangeError, ValueError, OSError) as exc:
            raise ExchangeError(f"asset {ref.path}: {exc}"[:300]) from None
    if assets:
        log("activation.assets_ready", files=len(assets))


def prune(root: Path, assets: tuple[FileRef, ...]) -> None:
    """Remove from `root` whatever is not one of `assets` or a directory on the way to one
    (links included, never followed); all of `root` if the assets are none, or if what is
    there cannot be sorted out (a directory the agent made unreadable, say)."""
    files = {ref.path for ref in assets}
    dirs = {
        "/".join(parts[:i]) for parts in (p.split("/") for p in files) for i in range(1, len(parts))
    }
    if not files or not _is_dir(root):
        remove_tree(root)
        return
    try:
        _prune_dir(root, "", files, dirs)
    except OSError as exc:
        log("activation.assets_reset", error=repr(exc)[:300])
        remove_tree(root)


def _prune_dir(directory: Path, prefix: str, files: set[str], dirs: set[str]) -> None:
    # The agent may have made it read-only: what is in it could not be replaced.
    directory.chmod(stat.S_IMODE(directory.lstat().st_mode) | stat.S_IRWXU)
    with os.scandir(directory) as listing:
        entries = list(listing)
    for entry in entries:
        relative = prefix + entry.name
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            if relative in dirs:
                _prune_dir(path, relative + "/", files, dirs)
            else:
                remove_tree(path)
        elif not (entry.is_file(follow_symlinks=False) and relative in files):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _read_only(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fchmod(fd, READ_ONLY)
    finally:
        os.close(fd)


def _is_dir(path: Path) -> bool:
    """Whether `path` itself (not through a link) is a directory."""
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False
