"""Files through the broker, for sandboxes that share neither a disk nor the platform's NATS with
it (kubernetes Jobs): the runner fetches the session's artifacts into `/workspace/in` and sends
what it left in `/workspace/out` back, with its activation token.

- `GET /runner/files/{artifact_id}`: the bytes of an artifact of the token's own session (any
  other, deleted, or unknown one is 404 alike, so nothing about other sessions leaks).
- `GET /runner/assets/{sha256}`: the bytes of an asset of the token's agent package (on every
  backend: the runner fetches the package's assets itself), one the package lists or once
  listed; any other digest is 404, whoever's blob it names.
- `PUT /runner/files/out/{index}?path=…`: one output file, the raw bytes as the body. `index`
  counts the activation's outputs from 0 and names the artifact (`derived_id`), so a retried
  upload is the same artifact and no replica can be talked into more than `max_artifacts` of
  them; a body over `max_artifact_bytes` is refused while it is read.
"""

from __future__ import annotations

import asyncio
import hashlib
import mimetypes
import tempfile
import weakref
from typing import IO, Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import StreamingResponse
from nats.js.errors import ObjectNotFoundError

from suzumio.contracts.broker import Recorded
from suzumio.contracts.commands import RecordArtifact
from suzumio.contracts.errors import ConflictError
from suzumio.contracts.events import AgentCreated, AgentUpdated, ArtifactDeleted, ArtifactRecorded
from suzumio.contracts.ids import Identifier, derived_id
from suzumio.contracts.runner import placeable
from suzumio.platform.bus.objects import open_blob, put_blob
from suzumio.platform.offloop import OffLoopWriter
from suzumio.platform.shares import Shares
from suzumio.toolbroker.access import Caller
from suzumio.toolbroker.problems import BrokerError
from suzumio.toolbroker.routes import Auth, Shared
from suzumio.toolbroker.state import Broker

router = APIRouter()
SPOOL_BYTES = 1 << 20  # smaller outputs stay in memory while they are hashed


def output_artifact_id(activation_id: str, index: int) -> str:
    return derived_id("artifact", activation_id, "out", str(index))


async def _recorded(broker: Broker, artifact_id: str) -> ArtifactRecorded | None:
    """The artifact as recorded, or None if it does not exist or was deleted."""
    recorded, _ = await _artifact(broker, artifact_id)
    return recorded


async def _artifact(broker: Broker, artifact_id: str) -> tuple[ArtifactRecorded | None, bool]:
    """The artifact as recorded (None if it does not exist or was deleted), and whether it
    was deleted."""
    stream = await broker.store.load("artifact", artifact_id)
    recorded: ArtifactRecorded | None = None
    deleted = False
    for event in stream.events:
        if isinstance(event.data, ArtifactRecorded):
            recorded, deleted = event.data, False
        elif isinstance(event.data, ArtifactDeleted):
            recorded, deleted = None, True
    return recorded, deleted


@router.get("/runner/files/{artifact_id}", response_class=StreamingResponse)
async def fetch(artifact_id: Identifier, caller: Auth, broker: Shared) -> StreamingResponse:
    """An artifact of the activation's session, streamed."""
    recorded = await _recorded(broker, artifact_id)
    files = broker.artifacts
    missing = BrokerError(404, "not_found", "no such artifact in this activation's session")
    if recorded is None or recorded.session_id != caller.claims.session_id:
        raise missing
    try:
        chunks = await open_blob(broker.js, files.store, files.bucket, recorded.sha256)
    except ObjectNotFoundError:
        raise missing from None
    return StreamingResponse(
        chunks,
        media_type="application/octet-stream",
        headers={"Content-Length": str(recorded.size), "ETag": f'"{recorded.sha256}"'},
    )


async def _listed_size(broker: Broker, agent_id: str, sha256: str) -> int | None:
    """The size of the agent package's asset with this digest, if its package lists or once
    listed one (an activation planned before a package update still fetches the assets it
    was planned with); else None."""
    stream = await broker.store.load("agent", agent_id)
    for event in stream.events:
        if isinstance(event.data, AgentCreated | AgentUpdated):
            for asset in event.data.assets or ():
                if asset.sha256 == sha256:
                    return asset.size
    return None


@router.get("/runner/assets/{sha256}", response_class=StreamingResponse)
async def fetch_asset(
    sha256: Annotated[str, Path(pattern=r"^[0-9a-f]{64}$")], caller: Auth, broker: Shared
) -> StreamingResponse:
    """An asset of the activation's agent package, by its digest, streamed."""
    files = broker.artifacts
    size = await _listed_size(broker, caller.claims.agent_id, sha256)
    missing = BrokerError(404, "not_found", "no such asset in this activation's agent package")
    if size is None:
        raise missing
    try:
        chunks = await open_blob(broker.js, files.store, files.bucket, sha256)
    except ObjectNotFoundError:
        raise missing from None
    return StreamingResponse(
        chunks,
        media_type="application/octet-stream",
        headers={"Content-Length": str(size), "ETag": f'"{sha256}"'},
    )


# The outputs being uploaded on this replica, by artifact id (an entry goes with its last user).
_uploading: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
_uploads = Shares()  # the uploads on this replica, by activation
MAX_UPLOADS_PER_ACTIVATION = 4


@router.put("/runner/files/out/{index}")
async def store_output(
    request: Request,
    index: Annotated[int, Path(ge=0)],
    path: Annotated[str, Query(min_length=1, max_length=1_000)],
    caller: Auth,
    broker: Shared,
) -> Recorded:
    """One file the activation left in `/workspace/out`, recorded as an artifact of its
    session (source `activation`) once its bytes are stored."""
    limits = broker.artifacts
    if index >= limits.max_files:
        raise BrokerError(413, "too_many", f"at most {limits.max_files} output files")
    if not placeable(path):
        raise BrokerError(422, "invalid", "path: a relative path of named parts")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_bytes:
        raise BrokerError(413, "too_large", f"output files are at most {limits.max_bytes} bytes")
    # An index is one file for good: bytes for one already recorded as another are refused
    # before they are stored — else each refused upload stayed in the object store, which
    # nothing references and nothing collects, and a sandbox could fill the disk the log is on.
    # One upload of an index at a time on a replica: uploads of it at once each stored their
    # bytes before one was recorded. (Replicas may still race: rare, and bounded by them.)
    artifact_id = output_artifact_id(caller.claims.activation_id, index)
    # A few uploads of an activation's at once on a replica, before any body is read: its
    # runner sends them one at a time (a retry of one may overlap it), and a sandbox
    # sending all its indexes at once held their bodies in memory and on disk together.
    if _uploads.held(caller.claims.activation_id) >= MAX_UPLOADS_PER_ACTIVATION:
        # A 503, which every runner tries again (after Retry-After): a 429 is a refusal to
        # it, and the file was dropped — one whose earlier try timed out still holding its
        # place, say.
        raise BrokerError(
            503,
            "unavailable",
            f"an activation uploads at most {MAX_UPLOADS_PER_ACTIVATION} files at once",
            {"Retry-After": "1"},
        )
    release = _uploads.take(caller.claims.activation_id)
    try:
        lock = _uploading.setdefault(artifact_id, asyncio.Lock())
        async with lock:
            return await _store_output(request, index, path, caller, broker, artifact_id)
    finally:
        release()


async def _store_output(
    request: Request, index: int, path: str, caller: Caller, broker: Broker, artifact_id: str
) -> Recorded:
    limits = broker.artifacts
    before, deleted = await _artifact(broker, artifact_id)
    if before is not None and before.path != path:
        raise BrokerError(409, "conflict", f"output {index} is another file already")
    if deleted:  # its id is taken for good: the session service would refuse it, bytes stored
        raise BrokerError(409, "conflict", f"output {index} was recorded, then deleted")
    with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as spool:
        sha256, size = await _receive(request, spool, limits.max_bytes)
        if before is not None:
            if before.sha256 == sha256:
                return Recorded(recorded=False)  # the same upload again (a lost reply)
            raise BrokerError(409, "conflict", f"output {index} is another file already")
        # The token was checked before the body came; a cancel may have come while it did
        # (up to max_bytes takes a while), and a fenced activation records nothing.
        await broker.gate.still_live(caller)
        spool.seek(0)
        await put_blob(limits.store, sha256, spool)  # type: ignore[arg-type]
    await broker.gate.still_live(caller)  # storing a large blob takes a while too
    return await _record(broker, caller, index, path, sha256, size)


async def _receive(request: Request, sink: IO[bytes], max_bytes: int) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    writer = OffLoopWriter(sink)  # past SPOOL_BYTES the spool is a file on disk
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise BrokerError(413, "too_large", f"output files are at most {max_bytes} bytes")
        digest.update(chunk)
        await writer.write(chunk)
    await writer.close()
    return digest.hexdigest(), size


async def _record(
    broker: Broker, caller: Caller, index: int, path: str, sha256: str, size: int
) -> Recorded:
    c = caller.claims
    artifact_id = output_artifact_id(c.activation_id, index)
    try:
        await broker.commands.send(
            RecordArtifact(
                project_id=c.project_id,
                artifact_id=artifact_id,
                session_id=c.session_id,
                path=path,
                sha256=sha256,
                size=size,
                content_type=mimetypes.guess_type(path)[0] or "application/octet-stream",
                source="activation",
                activation_id=c.activation_id,
            ),
            actor=caller.actor,
        )
    except ConflictError:
        before = await _recorded(broker, artifact_id)
        if before is not None and (before.path, before.sha256) == (path, sha256):
            return Recorded(recorded=False)  # the same upload again (a lost reply)
        raise BrokerError(409, "conflict", f"output {index} is another file already") from None
    return Recorded(recorded=True)
