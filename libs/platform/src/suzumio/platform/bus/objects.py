"""Content-addressed blobs in a JetStream object store: `sha256/<hex>` holds those bytes.

nats-py can put from a file object but only gets into memory or a file; `read_chunks` streams
an object's chunks as they arrive (the object store's own protocol: an ordered consumer on the
object's chunk subject), so a download never holds a whole file in memory.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
from collections.abc import AsyncIterator
from io import BufferedIOBase

from nats.aio.msg import Msg
from nats.js.client import JetStreamContext
from nats.js.errors import ObjectNotFoundError
from nats.js.object_store import ObjectStore

from suzumio.contracts.subjects import blob_name

CHUNKS_SUBJECT = "$O.{bucket}.C.{nuid}"


async def has_blob(store: ObjectStore, sha256_hex: str) -> bool:
    try:
        await store.get_info(blob_name(sha256_hex))
    except ObjectNotFoundError:
        return False
    return True


async def put_blob(store: ObjectStore, sha256_hex: str, source: BufferedIOBase) -> None:
    """Store `source` under its digest, unless those bytes are stored already."""
    if not await has_blob(store, sha256_hex):
        await store.put(blob_name(sha256_hex), source)


async def read_chunks(
    js: JetStreamContext, store: ObjectStore, bucket: str, sha256_hex: str, *, timeout: float = 10
) -> AsyncIterator[bytes]:
    """The blob's bytes, chunk by chunk, checked against its digest at the end.

    Raises:
        ObjectNotFoundError: no such blob.
    """
    info = await store.get_info(blob_name(sha256_hex))
    if not info.size:
        return
    queue: asyncio.Queue[Msg] = asyncio.Queue(maxsize=64)
    sub = await js.subscribe(
        CHUNKS_SUBJECT.format(bucket=bucket, nuid=info.nuid),
        ordered_consumer=True,
        cb=queue.put,
    )
    digest = hashlib.sha256()
    try:
        for _ in range(info.chunks or 0):
            msg = await asyncio.wait_for(queue.get(), timeout)
            digest.update(msg.data)
            yield msg.data
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    expected = (info.digest or "").removeprefix("SHA-256=")
    if expected and base64.urlsafe_b64encode(digest.digest()).decode() != expected:
        raise OSError(f"blob {sha256_hex} is corrupt")
