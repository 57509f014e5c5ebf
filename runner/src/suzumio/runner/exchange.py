"""A pool worker's file exchange with the platform, through the artifacts' object store: the
session's artifacts copied into `/workspace/in` before the runner starts, and what it left in
`/workspace/out` stored afterwards (content-addressed, as the orchestrator stores local ones).

The worker does this, not the runner: the sandbox never holds NATS credentials. Paths stay
inside their directory (no `..`, no symlinks followed); files over the dispatch's size limit,
and any beyond its count, stay behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import os
import shutil
import stat
from pathlib import Path
from typing import BinaryIO

from nats.js.errors import ObjectNotFoundError
from nats.js.object_store import ObjectStore

from suzumio.contracts.runner import FileRef
from suzumio.contracts.subjects import blob_name
from suzumio.runner.log import log


class ExchangeError(Exception):
    """An input could not be brought in: the activation cannot start as planned."""


async def bring_in(store: ObjectStore, inbox: Path, refs: tuple[FileRef, ...]) -> None:
    """Each file of `refs` at its path under `inbox`; one already there with the same size
    (a warm workspace's) is kept.

    Raises:
        ExchangeError: a file is missing from the store, could not be written, or its
            directory is a link out of `inbox` (planted by an earlier activation).
    """
    for ref in refs:
        slot = _slot(inbox, ref)
        if slot is None:
            continue
        target, partial, sink = slot
        try:
            with sink:
                await store.get(blob_name(ref.sha256), writeinto=sink)  # checks the digest
            partial.replace(target)
        except Exception as exc:  # missing, unwritable, the store's own (digest, timeout)
            with contextlib.suppress(OSError):
                partial.unlink()
            raise ExchangeError(f"input {ref.path}: {exc!r}"[:300]) from None


def _slot(inbox: Path, ref: FileRef) -> tuple[Path, Path, io.BufferedWriter] | None:
    """Where `ref` goes and a fresh partial file to write it to; None if it is there."""
    target = inbox / ref.path
    if target.is_file() and not target.is_symlink() and target.stat().st_size == ref.size:
        return None
    partial = target.with_name(f".{target.name}.part")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        inside = target.parent.resolve().is_relative_to(inbox.resolve())
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        if inside:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            return target, partial, os.fdopen(os.open(partial, flags, 0o644), "wb")
    except OSError as exc:
        raise ExchangeError(f"input {ref.path}: {exc!r}"[:300]) from None
    raise ExchangeError(f"input {ref.path}: its directory leads outside the inputs")


async def bring_out(
    store: ObjectStore, outbox: Path, max_files: int, max_bytes: int
) -> tuple[FileRef, ...]:
    """Store the regular files under `outbox` (never following a symlink) and empty it, so a
    warm workspace does not hand them in again as the next activation's output: what is over
    the limits is logged and left out. With `max_files` 0 nothing is collected or removed."""
    if max_files <= 0:
        return ()
    stored: list[FileRef] = []
    for path in _files(outbox):
        if len(stored) >= max_files:
            log("exchange.too_many_outputs", limit=max_files)
            break
        try:
            ref = await _store_one(store, outbox, path, max_bytes)
        except Exception as exc:  # this file stays behind; the others still go
            log("exchange.output_skipped", error=repr(exc)[:300])
            continue
        if ref is not None:
            stored.append(ref)
    _empty(outbox)
    return tuple(stored)


async def _store_one(
    store: ObjectStore, outbox: Path, path: Path, max_bytes: int
) -> FileRef | None:
    # Opened without following a link, and checked as opened: the sandbox may have left a
    # link in place of a file to make the worker upload something of its host.
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as source:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        if info.st_size > max_bytes:
            log("exchange.output_too_large", path=str(path.relative_to(outbox)), size=info.st_size)
            return None
        digest = await asyncio.to_thread(_sha256, source)
        ref = FileRef(path=path.relative_to(outbox).as_posix(), sha256=digest, size=info.st_size)
        try:
            await store.get_info(blob_name(digest))
        except ObjectNotFoundError:
            source.seek(0)
            await store.put(blob_name(digest), source)
    return ref


def _files(root: Path) -> list[Path]:
    """The files under `root`, sorted, without descending into a linked directory."""
    if not root.is_dir() or root.is_symlink():
        return []
    found: list[Path] = []
    for directory, dirs, files in os.walk(root, followlinks=False):
        base = Path(directory)
        found.extend(p for p in (base / f for f in files) if p.is_file() and not p.is_symlink())
        dirs[:] = [d for d in dirs if not (base / d).is_symlink()]
    return sorted(found)


def _empty(root: Path) -> None:
    if not root.is_dir() or root.is_symlink():
        return
    for child in root.iterdir():
        with contextlib.suppress(OSError):
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()


def _sha256(source: BinaryIO) -> str:
    digest = hashlib.sha256()
    for block in iter(lambda: source.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()
