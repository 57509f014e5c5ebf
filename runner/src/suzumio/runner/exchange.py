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
import tempfile
from functools import partial
from io import BufferedIOBase, BufferedWriter
from pathlib import Path
from typing import BinaryIO, cast

from nats.js.errors import ObjectNotFoundError
from nats.js.object_store import ObjectStore

from suzumio.contracts.runner import FileRef
from suzumio.contracts.subjects import blob_name
from suzumio.runner.log import log
from suzumio.runner.workfiles import (
    ExchangeError,
    empty,
    holds_nothing,
    open_output,
    place,
    regular_files,
)

__all__ = ["ExchangeError", "bring_in", "bring_out"]

Spooled = tempfile.SpooledTemporaryFile[bytes]
SPOOL_BYTES = 8 * 1024 * 1024  # an output copied aside stays in memory up to this size
CHUNK_STALL_SECONDS = 60.0  # an input's read with no chunk for this long fails


async def bring_in(store: ObjectStore, inbox: Path, refs: tuple[FileRef, ...]) -> None:
    """Each file of `refs` at its path under `inbox`; one already there with exactly its bytes
    (a warm workspace's) is kept.

    Raises:
        ExchangeError: a file is missing from the store, could not be written, or its
            directory is a link out of `inbox` (planted by an earlier activation).
    """
    for ref in refs:
        try:
            await place(inbox, ref, partial(_fetch, store, ref))
        except ExchangeError:
            raise
        except Exception as exc:  # missing, unwritable, the store's own (digest, timeout)
            raise ExchangeError(f"input {ref.path}: {exc!r}"[:300]) from None


async def _fetch(store: ObjectStore, ref: FileRef, sink: BufferedWriter) -> None:
    """The blob's bytes into `sink`, checked against the digest it is named by.

    Not nats-py's `ObjectStore.get`: stopped midway (a cancel, a write that failed — a full
    disk, which the worker retries), it left its subscription behind — an ordered consumer
    with tasks of its own, and the server's consumer with its buffered chunks — and it waited
    with no bound for a chunk that never came (the object deleted under it), holding the
    worker's slot. Here the subscription goes however the read ends, and a read that stalls
    for `CHUNK_STALL_SECONDS` fails."""
    info = await store.get_info(blob_name(ref.sha256))
    if info.is_link() or not info.nuid:
        raise ExchangeError(f"blob {ref.sha256} is no plain object of the store")
    digest = hashlib.sha256()
    if info.size:
        # The object store's layout (nats-py's own, `OBJ_CHUNKS_PRE_TEMPLATE`): its chunks'
        # subject, in the bucket's stream.
        subject = f"$O.{store._name}.C.{info.nuid}"
        chunks = await store._js.subscribe(subject, ordered_consumer=True)
        loop = asyncio.get_running_loop()
        try:
            while True:
                msg = await chunks.next_msg(timeout=CHUNK_STALL_SECONDS)
                await loop.run_in_executor(None, sink.write, msg.data)
                digest.update(msg.data)
                if msg.metadata.num_pending == 0:
                    break
        finally:
            with contextlib.suppress(Exception):
                await chunks.unsubscribe()
    if digest.hexdigest() != ref.sha256:
        raise ExchangeError(f"blob {ref.sha256} read back as {digest.hexdigest()}")


async def bring_out(
    store: ObjectStore, outbox: Path, max_files: int, max_bytes: int
) -> tuple[FileRef, ...]:
    """Store the regular files under `outbox` (never following a symlink) and empty it, so a
    warm workspace does not hand them in again as the next activation's output: what is over
    the limits is logged and left out. With `max_files` 0 nothing is collected or removed."""
    if max_files <= 0 or holds_nothing(outbox):
        return ()
    stored: list[FileRef] = []
    # Walked and emptied off the event loop: an agent's million files (a `node_modules`)
    # held the worker's loop — its other runs' heartbeats too — for seconds on end.
    try:
        for path in await asyncio.to_thread(regular_files, outbox):
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
    finally:
        await asyncio.to_thread(empty, outbox)
    return tuple(stored)


async def _store_one(
    store: ObjectStore, outbox: Path, path: Path, max_bytes: int
) -> FileRef | None:
    opened = open_output(path)
    if opened is None:
        return None
    source, size = opened
    with source:
        if size > max_bytes:
            log("exchange.output_too_large", path=str(path.relative_to(outbox)), size=size)
            return None
        copied = await asyncio.to_thread(_copy_aside, source, max_bytes)
    if copied is None:
        log("exchange.output_too_large", path=str(path.relative_to(outbox)), size=size)
        return None
    copy, digest, size = copied
    with copy:
        ref = FileRef(path=path.relative_to(outbox).as_posix(), sha256=digest, size=size)
        try:
            await store.get_info(blob_name(digest))
        except ObjectNotFoundError:
            await store.put(blob_name(digest), cast("BufferedIOBase", copy))  # has readinto
    return ref


def _copy_aside(source: BinaryIO, limit: int) -> tuple[Spooled, str, int] | None:
    """A private copy of `source`, its SHA-256 and size (None past `limit` bytes). The bytes
    stored are those hashed: hashed in place and read again to be stored, a file that a
    process of the sandbox changed in between went into the store under the digest of other
    bytes — a blob every later upload of the right bytes, from any project, takes as stored."""
    copy: Spooled = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115
    digest, size = hashlib.sha256(), 0
    try:
        while block := source.read(1 << 20):
            size += len(block)
            if size > limit:
                copy.close()
                return None
            digest.update(block)
            copy.write(block)
        copy.seek(0)
    except BaseException:
        copy.close()
        raise
    return copy, digest.hexdigest(), size
