"""Content-addressed blobs in a JetStream object store: `sha256/<hex>` holds those bytes.

nats-py can put from a file object but only gets into memory or a file; `read_chunks` streams
an object's chunks as its reader takes them (Direct Gets of the object's chunk subject, a few
chunks a round trip), so a download never holds more than those in memory, however slowly
its client reads.

`put_blob` writes the object store's own layout (chunks on `$O.<bucket>.C.<nuid>`, then the
object's record on `$O.<bucket>.M.<name>`) rather than calling nats-py's `put`, which replaces
an object: a blob is stored once and never replaced. nats-py's `put` (a) purges the chunks of
the object it replaces, under a download that may be reading them; (b) leaves a lost put's
chunks for ever when two puts of one digest race (each saw no object before it wrote); (c)
purges its own chunks when the record's acknowledgement is lost although the record was
stored, leaving a record that names nothing (and every later put of those bytes skips it as
stored); (d) leaves its chunks behind when it is cancelled. Here the record is appended only
if no record is there yet (`Nats-Expected-Last-Subject-Sequence`), and whatever did not become
a blob is purged, unless the record stored names it — or may yet name it (its publish
went out and its fate is unknown: it may land later), when the sweep below takes them.

The bytes sent are checked against the digest they are stored under before the record is
written: the wrong bytes, recorded, would stand under that name for good.

What a put cannot clean up after itself — a process killed between its chunks and its record
— `sweep_stray_chunks` does: chunks that no live record names, untouched for long enough that
no put can still be writing them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from io import BufferedIOBase

from nats.js import api
from nats.js.client import JetStreamContext
from nats.js.errors import APIError, NotFoundError, ObjectNotFoundError
from nats.js.object_store import ObjectStore
from nats.nuid import NUID

from suzumio.contracts.subjects import blob_name
from suzumio.platform.bus.direct_get import iter_subject
from suzumio.platform.bus.eventstore import ERR_WRONG_LAST_SEQUENCE
from suzumio.platform.bus.jsapi import stream_last_seq
from suzumio.platform.bus.trouble import NATS_TROUBLE

CHUNKS_SUBJECT = "$O.{bucket}.C.{nuid}"
RECORD_SUBJECT = "$O.{bucket}.M.{name}"
CHUNK_BYTES = 128 * 1024  # what nats-py and the other clients cut objects into
CHUNKS_PER_READ = 8  # a download holds at most this many chunks (1 MiB) in memory
_FATE_UNKNOWN: tuple[type[BaseException], ...] = (
    TimeoutError,
    asyncio.CancelledError,
    *NATS_TROUBLE,
)
OBJECTS_STREAM = "OBJ_{bucket}"
SETTLE_SECONDS = 5.0
_nuids = NUID()


async def has_blob(store: ObjectStore, sha256_hex: str) -> bool:
    try:
        await store.get_info(blob_name(sha256_hex))
    except ObjectNotFoundError:
        return False
    return True


async def put_blob(store: ObjectStore, sha256_hex: str, source: BufferedIOBase) -> None:
    """Store `source` under its digest, unless those bytes are stored already (see the module
    docstring for why this is not nats-py's `put`)."""
    if await has_blob(store, sha256_hex):
        return
    js: JetStreamContext = store._js  # the layout below is the store's own
    bucket: str = store._name
    name = blob_name(sha256_hex)
    nuid = _nuids.next().decode()
    chunks = CHUNKS_SUBJECT.format(bucket=bucket, nuid=nuid)
    recording = False
    try:
        info = await _send_chunks(js, chunks, source, name, bucket, nuid)
        _check_digest(info, sha256_hex)
        recording = True
        if await _send_record(js, store, bucket, name, info):
            return
        failure: BaseException | None = None
    except BaseException as exc:
        failure = exc
    # Not a blob of ours (another put's record came first, or this one failed or was cancelled
    # on the way): its chunks go, unless the record stored names them after all (an answer
    # lost on the way back). Shielded: a cancelled put must still clean up after itself.
    # Its record may be on the way still: sent, and its answer lost (a timeout, the connection
    # in trouble, a cancel while it waited) — not a refusal, which stored nothing.
    unsure = recording and isinstance(failure, _FATE_UNKNOWN)
    stored = await asyncio.shield(_settle(store, name, nuid, chunks, unsure=unsure))
    if failure is None or (stored and not isinstance(failure, asyncio.CancelledError)):
        return
    raise failure


class BlobDigestError(ValueError):
    """The bytes given to `put_blob` are not those its digest names."""


def _check_digest(info: api.ObjectInfo, sha256_hex: str) -> None:
    """Raise unless the bytes sent are those `sha256_hex` names: recorded, the wrong bytes
    would stand under the name for good (every later put of the right ones finds it stored,
    and skips). Its chunks then go, as a failed put's do."""
    if info.digest != _digest_of(sha256_hex):
        raise BlobDigestError(f"{info.name}: the bytes sent are not those of its digest")


def _digest_of(sha256_hex: str) -> str:
    """The object store's digest field of the bytes whose SHA-256 is `sha256_hex`."""
    try:
        raw = bytes.fromhex(sha256_hex)
    except ValueError:
        return ""
    return f"SHA-256={base64.urlsafe_b64encode(raw).decode()}"


async def _send_chunks(
    js: JetStreamContext, subject: str, source: BufferedIOBase, name: str, bucket: str, nuid: str
) -> api.ObjectInfo:
    digest = hashlib.sha256()
    size = count = 0
    while chunk := await asyncio.to_thread(source.read, CHUNK_BYTES):
        digest.update(chunk)
        await js.publish(subject, chunk)
        size += len(chunk)
        count += 1
    return api.ObjectInfo(
        name=name,
        bucket=bucket,
        nuid=nuid,
        size=size,
        chunks=count,
        digest=f"SHA-256={base64.urlsafe_b64encode(digest.digest()).decode()}",
        mtime=datetime.now(UTC).isoformat(),
        options=api.ObjectMetaOptions(max_chunk_size=CHUNK_BYTES),
    )


async def _send_record(
    js: JetStreamContext, store: ObjectStore, bucket: str, name: str, info: api.ObjectInfo
) -> bool:
    """Append the object's record if none is there yet (or over a deleted one); False if a
    live record came first."""
    subject = RECORD_SUBJECT.format(
        bucket=bucket, name=base64.urlsafe_b64encode(name.encode()).decode()
    )
    expected = 0
    for _ in range(3):
        try:
            await js.publish(
                subject,
                json.dumps(info.as_dict()).encode(),
                headers={
                    api.Header.ROLLUP: "sub",
                    api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE: str(expected),
                },
            )
        except APIError as exc:
            if exc.err_code not in ERR_WRONG_LAST_SEQUENCE:  # 10164: the cluster's word
                raise
        else:
            return True
        try:
            last = await js.get_last_msg(store._stream, subject)
        except NotFoundError:
            expected = 0
            continue
        if not json.loads(last.data or b"{}").get("deleted"):
            return False
        expected = last.seq or 0  # a deleted blob (`nats object rm`): stored again
    raise OSError(f"{name}: its record kept changing while it was stored")


async def _settle(store: ObjectStore, name: str, nuid: str, chunks: str, *, unsure: bool) -> bool:
    """True if the record stored names `nuid`; else its chunks are purged (if NATS answers:
    a few chunks left behind beat a record whose chunks are gone).

    `unsure`: its record was sent and its fate is unknown (a timeout, a lost connection, a
    cancel on the way). With no record there yet, it may still land — buffered in the client
    across a reconnect, or being agreed on in a cluster — and purged chunks then left a
    record naming nothing, which every later put of those bytes took for stored. Its chunks
    stay then: `sweep_stray_chunks` takes them an hour on if no record names them by then.
    Another record there refuses it for good (it expects none), and its chunks go."""
    try:
        async with asyncio.timeout(SETTLE_SECONDS):
            try:
                if (await store.get_info(name)).nuid == nuid:
                    return True
            except ObjectNotFoundError:
                if unsure:
                    return False
            await store._js.purge_stream(store._stream, subject=chunks)
    except Exception:  # noqa: S110 - NATS away: nothing can be done about it now
        pass
    return False


async def sweep_stray_chunks(store: ObjectStore, older_than: float) -> int:
    """Purge the chunks no live record names whose last chunk is older than `older_than`
    seconds (a put writes its record right after its last chunk, and cleans up after itself
    when it fails: what is left that long is a killed put's); how many objects' chunks went.

    The chunk subjects are listed before the records: a put that ends in between has its
    record listed, and one that starts has chunks too new to be touched."""
    js: JetStreamContext = store._js
    bucket: str = store._name
    subjects = await _chunk_subjects(
        js, store._stream, CHUNKS_SUBJECT.format(bucket=bucket, nuid=">")
    )
    if not subjects:
        return 0
    try:
        named = {info.nuid for info in await store.list() if not info.deleted}
    except NotFoundError:  # no record at all
        named = set()
    swept = 0
    now = datetime.now(UTC)
    for subject in subjects:
        if subject.rsplit(".", 1)[1] in named:
            continue
        try:
            last = await js.get_last_msg(store._stream, subject)
        except NotFoundError:  # purged since it was listed
            continue
        if last.time is None or (now - last.time).total_seconds() < older_than:
            continue
        await js.purge_stream(store._stream, subject=subject)
        swept += 1
    return swept


async def _chunk_subjects(js: JetStreamContext, stream: str, pattern: str) -> list[str]:
    """The stream's subjects matching `pattern` that hold messages, page by page (the server
    answers a page of them at a time; nats-py's `stream_info` reads the first only)."""
    subjects: list[str] = []
    while True:
        request = {"subjects_filter": pattern, "offset": len(subjects)}
        answer = await js._api_request(
            f"{js._prefix}.STREAM.INFO.{stream}", json.dumps(request).encode(), timeout=js._timeout
        )
        page = list((answer.get("state") or {}).get("subjects") or {})
        subjects += page
        if not page or len(subjects) >= int(answer.get("total") or 0):
            return subjects


async def read_chunks(
    js: JetStreamContext, store: ObjectStore, bucket: str, sha256_hex: str, *, timeout: float = 10
) -> AsyncIterator[bytes]:
    """The blob's bytes, chunk by chunk, checked against its digest at the end.

    Raises:
        ObjectNotFoundError: no such blob.
    """
    async for chunk in await open_blob(js, store, bucket, sha256_hex, timeout=timeout):
        yield chunk


async def open_blob(
    js: JetStreamContext, store: ObjectStore, bucket: str, sha256_hex: str, *, timeout: float = 10
) -> AsyncIterator[bytes]:
    """As `read_chunks`, with the blob looked up here: a route streaming it answers a missing
    blob, or NATS in trouble, before its 200 and Content-Length went out (an async
    generator's first lines run only at its first chunk). The chunks are subscribed to as the
    first is read: a stream never started leaves no subscription behind.

    Raises:
        ObjectNotFoundError: no such blob.
    """
    info = await store.get_info(blob_name(sha256_hex))
    return _chunks(js, bucket, info, sha256_hex, timeout)


async def _chunks(
    js: JetStreamContext, bucket: str, info: api.ObjectInfo, sha256_hex: str, timeout: float
) -> AsyncIterator[bytes]:
    digest = hashlib.sha256()
    if not info.size:
        _check(digest, sha256_hex)
        return
    # Read a few chunks a round trip, as the reader takes them: an ordered push consumer had
    # the server send them all while a slow client read (nats-py answers flow control as they
    # arrive, not as they are taken), so a slow download held the whole blob in memory, and
    # past the subscription's pending limit chunks were dropped, never sent again.
    stream = OBJECTS_STREAM.format(bucket=bucket)
    subject = CHUNKS_SUBJECT.format(bucket=bucket, nuid=info.nuid)
    wanted, read, after, stored_up_to = info.chunks or 0, 0, 0, 0
    for _ in range(2):
        chunks = iter_subject(
            js._nc,
            stream,
            subject,
            after_seq=after,
            batch=CHUNKS_PER_READ,
            timeout=timeout,
            min_last_seq=stored_up_to,
        )
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                digest.update(chunk.data)
                read, after = read + 1, chunk.seq
                yield chunk.data
                if read >= wanted:
                    break
        if read >= wanted or stored_up_to:
            break
        # Ended short: a replica behind the rest (in a cluster) may have answered. Once more,
        # from one that holds the stream up to its end now — the chunks were stored before
        # their record, so before now (asked only then: the stream's leader answers it).
        stored_up_to = await stream_last_seq(js._nc, stream, timeout=timeout)
    if read < wanted:
        raise OSError(f"blob {sha256_hex} is missing {wanted - read} of its {wanted} chunks")
    _check(digest, sha256_hex)


def _check(digest: hashlib._Hash, sha256_hex: str) -> None:
    # Against the name, not only the digest the object's record states: whoever stored it
    # computed both, and a blob is trusted by its name (a later put of those bytes skips it).
    if digest.hexdigest() != sha256_hex.lower():
        raise OSError(f"blob {sha256_hex} is corrupt")
