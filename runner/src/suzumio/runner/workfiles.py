"""The file handling both ways of exchanging a workspace's files share — a pool worker's through
the object store (`exchange`) and a sandbox runner's through the broker (`handover`): inputs
written to a fresh partial file and moved into place, outputs found and opened without ever
following a link (the sandbox may have planted one to make its host's files leave), and `out/`
emptied afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import os
import shutil
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import BinaryIO

from suzumio.contracts.runner import FileRef


class ExchangeError(Exception):
    """An input could not be brought in: the activation cannot start as planned."""


class WorkspaceError(ExchangeError):
    """The workspace cannot take an input at its path (a directory or a link where it goes, or
    on the way): not the store's doing, and the same next time in this workspace."""


def open_slot(inbox: Path, ref: FileRef) -> tuple[Path, Path, io.BufferedWriter]:
    """Where `ref` goes and a fresh partial file to write it to.

    Raises:
        WorkspaceError: the file cannot be written, or `inbox` or a directory on the way is a
            link (out of `inbox`, maybe: nothing is made or written through it).
    """
    target = inbox / ref.path
    partial = target.with_name(f".{target.name}.part")
    try:
        if _directory_in(inbox, Path(ref.path).parts[:-1]) is not None:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            return target, partial, os.fdopen(os.open(partial, flags, 0o644), "wb")
    except OSError as exc:
        raise WorkspaceError(f"input {ref.path}: {exc!r}"[:300]) from None
    raise WorkspaceError(f"input {ref.path}: its directory leads outside the inputs")


def _directory_in(inbox: Path, parts: tuple[str, ...]) -> Path | None:
    """`inbox`/`parts`, each directory made if missing, one step at a time; None if `inbox` or
    one on the way is a link. A sandbox of the same user may have planted one: a mkdir never
    goes through it, and what it can redirect narrows to a race."""
    inbox.mkdir(parents=True, exist_ok=True)
    if inbox.is_symlink():
        return None
    path = inbox
    for part in parts:
        path = path / part
        with contextlib.suppress(FileExistsError):
            path.mkdir()
        if path.is_symlink():
            return None
    return path


async def place(
    inbox: Path, ref: FileRef, fill: Callable[[io.BufferedWriter], Awaitable[object]]
) -> None:
    """`ref` at its path under `inbox`, written by `fill` into a partial file that is moved
    into place once complete; nothing if exactly those bytes are there already (a warm
    workspace's — one the agent changed, even to the same size, is replaced). A failing
    `fill` leaves no partial file behind, and its exception goes on.

    Raises:
        WorkspaceError: the file cannot be written where it goes, or `inbox` or its directory
            is a link.
    """
    if await asyncio.to_thread(holds, inbox, ref):
        return
    target, partial, sink = open_slot(inbox, ref)  # refuses a directory that leads outside
    try:
        with sink:
            await fill(sink)
        try:
            partial.replace(target)
        except OSError as exc:  # a directory where the file goes, say
            raise WorkspaceError(f"input {ref.path}: {exc!r}"[:300]) from None
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


def holds(inbox: Path, ref: FileRef) -> bool:
    """Whether `ref`'s place under `inbox` (in a directory inside it) is a regular file, not a
    link, with exactly `ref`'s bytes."""
    target = inbox / ref.path
    parts = Path(ref.path).parts[:-1]
    if any((inbox / Path(*parts[:i])).is_symlink() for i in range(len(parts) + 1)):
        return False
    try:
        opened = open_output(target)
    except OSError:  # missing, or a link
        return False
    if opened is None:
        return False
    source, size = opened
    with source:
        return size == ref.size and sha256_of(source) == ref.sha256


def open_output(path: Path) -> tuple[io.BufferedReader, int] | None:
    """`path` opened for reading with its size, or None if it is not a regular file. Opened
    without following a link, and checked as opened."""
    # Non-blocking to open: a FIFO the sandbox planted where an input or output goes held the
    # open (and the worker's next activation, or a thread for ever) until a writer came. A
    # regular file reads the same either way.
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    source = os.fdopen(fd, "rb")
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        source.close()
        return None
    os.set_blocking(fd, True)
    return source, info.st_size


def regular_files(root: Path) -> list[Path]:
    """The files under `root`, sorted, without descending into a linked directory. What
    cannot be looked at (a directory the agent made unreadable: `chmod -R 644 out`) is left
    out, never an error: the rest of the activation's output still goes."""
    if _mode(root) is None or not stat.S_ISDIR(_mode(root) or 0):
        return []
    found: list[Path] = []
    for directory, dirs, files in os.walk(root, followlinks=False):
        base = Path(directory)
        found.extend(p for p in (base / f for f in files) if stat.S_ISREG(_mode(p) or 0))
        dirs[:] = [d for d in dirs if stat.S_ISDIR(_mode(base / d) or 0)]
    return sorted(found)


def holds_nothing(root: Path) -> bool:
    """Whether there is nothing under `root` for `regular_files` to find or `empty` to do: it
    is no directory (missing, a file, a link), or one its owner may list and change that holds
    no entry. One `lstat` and the first entry of a listing: cheap enough for the event loop,
    where a walk is not — the usual `out/` is empty, and each trip to a thread and back cost
    a worker two wakeups per activation."""
    mode = _mode(root)
    if mode is None or not stat.S_ISDIR(mode):
        return True
    if mode & stat.S_IRWXU != stat.S_IRWXU:  # `empty` has its mode to put right
        return False
    try:
        with os.scandir(root) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def _mode(path: Path) -> int | None:
    """The mode of `path` itself (a link is a link), or None if it cannot be looked at."""
    try:
        return path.lstat().st_mode
    except OSError:
        return None


def remove_tree(root: Path) -> None:
    """`root` and everything under it, as far as it can go, never raising: a directory an
    agent made read-only (a Go module cache is) is made writable first, and no link is
    followed — to chmod through one would change the mode of what it points to."""
    if root.is_symlink() or not root.is_dir():
        with contextlib.suppress(OSError):
            root.unlink()
        return
    with contextlib.suppress(OSError):
        root.chmod(stat.S_IRWXU)
    for directory, dirs, _ in os.walk(root):  # top-down: each one writable before it is read
        for name in dirs:
            path = Path(directory, name)
            if not path.is_symlink():
                with contextlib.suppress(OSError):
                    path.chmod(stat.S_IRWXU)
    shutil.rmtree(root, ignore_errors=True)


def empty(root: Path) -> None:
    """Everything under `root` removed, `root` kept; never raising. The agent may have made
    `root` unreadable (`chmod 000 out`) or a directory in it read-only: `root` becomes its
    owner's to list and change again, and a directory goes as `remove_tree` removes one —
    else what it holds would stay, and a warm workspace would hand it in again as the next
    activation's output (and an unreadable `root` would fail the end of every run)."""
    mode = _mode(root)
    if mode is None or not stat.S_ISDIR(mode):  # missing, a file, or a link: nothing to do
        return
    if mode & stat.S_IRWXU != stat.S_IRWXU:
        with contextlib.suppress(OSError):
            root.chmod(stat.S_IMODE(mode) | stat.S_IRWXU)
    try:
        children = list(root.iterdir())
    except OSError:  # not ours to list: left as it is
        return
    for child in children:
        if stat.S_ISDIR(_mode(child) or 0):
            remove_tree(child)
        else:
            with contextlib.suppress(OSError):
                child.unlink()


def sha256_of(source: BinaryIO) -> str:
    digest = hashlib.sha256()
    for block in iter(lambda: source.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()
