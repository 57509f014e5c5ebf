"""Artifacts: files uploaded to a project (or one of its sessions), content-addressed."""

from __future__ import annotations

import posixpath
import re
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Query, Request, Response, status
from fastapi.responses import StreamingResponse
from nats.js.errors import ObjectNotFoundError
from pydantic import ValidationError

from suzumio.contracts.commands import DeleteArtifact, RecordArtifact
from suzumio.contracts.errors import ConflictError
from suzumio.contracts.ids import ID_PATTERN, Identifier
from suzumio.contracts.values import Clean, Role
from suzumio.gateway.api.auth import Principal
from suzumio.gateway.api.deps import (
    GatewayDep,
    Mint,
    MintDep,
    PrincipalDep,
    ReadPosition,
    require_role,
)
from suzumio.gateway.api.models import ArtifactOut, Uploaded
from suzumio.gateway.api.pagination import Page, PageRequest, page_of, page_request
from suzumio.gateway.api.problems import ApiError, not_found
from suzumio.gateway.api.routes.common import (
    RESPONSES,
    ReadModel,
    made_before,
    send,
    settle,
    settled,
)
from suzumio.gateway.queries.rows import page
from suzumio.gateway.state import Gateway
from suzumio.gateway.uploads import ReceivedFile, ReceivedForm, media_type, receive_form
from suzumio.platform.bus.objects import open_blob, put_blob

router = APIRouter(tags=["artifacts"], responses=RESPONSES)
ARTIFACTS_PROJECTION: ReadModel = (
    "artifacts"  # the read model artifacts are read from (`proj_artifacts`)
)
ID_RE = re.compile(ID_PATTERN)
Paging = Annotated[PageRequest, Depends(page_request)]
UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {
                            "type": "array",
                            "items": {"type": "string", "format": "binary"},
                            "description": "files; each part's filename is its relative path",
                        },
                        "session_id": {"type": "string", "description": "attach to this session"},
                    },
                }
            }
        },
    }
}


def _artifact(row: Any) -> ArtifactOut:
    return ArtifactOut(
        id=row["id"],
        project_id=row["project_id"],
        session_id=row["session_id"],
        path=row["path"],
        sha256=row["sha256"],
        size=row["size"],
        content_type=row["content_type"],
        source=row["source"],
        created_at=row["created_at"],
    )


def _relative(path: str) -> str:
    # A backslash is a Windows client's separator; what is left must pass the session
    # service's own check (relative, '/'-separated, not leaving its folder).
    norm = posixpath.normpath(path.replace("\\", "/"))
    if "\x00" in path or norm.startswith(("/", "../")) or norm in {".", "", ".."}:
        raise ApiError(422, f"file name {path!r} must be a relative path inside the upload")
    return norm


def _session_field(value: str | None) -> str | None:
    if not value:
        return None
    if ID_RE.fullmatch(value) is None:
        raise ApiError(422, "session_id is not an id")
    return value


def _records(
    project_id: str, session_id: str | None, form: ReceivedForm, ids: Mint
) -> list[RecordArtifact]:
    """Every part's command, built (and so checked) before any part is stored or recorded:
    one bad part refuses the whole upload."""
    if not form.files:
        raise ApiError(422, "the upload holds no file")
    return [
        _record(project_id, session_id, received, ids(f"artifact:{i}"))
        for i, received in enumerate(form.files)
    ]


def _record(
    project_id: str, session_id: str | None, received: ReceivedFile, artifact_id: str
) -> RecordArtifact:
    try:
        return RecordArtifact(
            project_id=project_id,
            artifact_id=artifact_id,
            session_id=session_id,
            path=_relative(received.filename),
            sha256=received.sha256,
            size=received.size,
            content_type=received.content_type,
        )
    except ValidationError as exc:
        why = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False)
        )
        name = received.filename[:200]
        raise ApiError(422, f"file {name!r} cannot be stored ({why})") from exc


@router.post(
    "/v1/projects/{project_id}/artifacts",
    status_code=status.HTTP_201_CREATED,
    openapi_extra=UPLOAD_BODY,
)
async def upload(
    project_id: Identifier,
    request: Request,
    gw: GatewayDep,
    who: PrincipalDep,
    response: Response,
    ids: MintDep,
) -> Uploaded:
    """Upload files (multipart, streamed). A part's filename is kept as its relative path
    (`docs/a.md`); the bytes are stored once per SHA-256."""
    await require_role(gw, who, project_id, Role.MEMBER, "project")
    form = await receive_form(
        request.headers.get("content-type"),
        request.stream(),
        max_file_bytes=gw.settings.max_upload_bytes,
        max_total_bytes=gw.settings.max_upload_request_bytes,
    )
    try:
        session_id = _session_field(form.fields.get("session_id"))
        commands = _records(project_id, session_id, form, ids)
        if session_id is not None:
            await _session_of(gw, project_id, session_id)
        for received in form.files:
            await put_blob(gw.artifacts, received.sha256, received.file)  # type: ignore[arg-type]
        position = 0
        for command in commands:
            position = max(position, await _recorded(gw, who, command, response, ids))
    finally:
        form.close()
    created = [c.artifact_id for c in commands]
    response.headers["Suzumio-Position"] = str(position)
    await settled(gw, position, reads="artifacts")
    rows = await gw.pool.fetch(
        "SELECT * FROM proj_artifacts.artifacts WHERE id = ANY($1::text[])", created
    )
    by_id = {r["id"]: r for r in rows}
    return Uploaded(items=[_artifact(by_id[i]) for i in created])


async def _recorded(
    gw: Gateway, who: Principal, command: RecordArtifact, response: Response, ids: Mint
) -> int:
    """Record one file of an upload; the log position that holds it.

    An upload sends a command per file. One that failed half-way (a command timed out, the
    gateway died) keeps no answer for its Idempotency-Key, and a retry with the key names the
    same artifacts: the files the first attempt recorded are refused as existing. Such a file
    recorded as the very one sent again is done, and the retry goes on with the rest; another
    file under its id (the retry sent other files) stays a conflict."""
    try:
        return (await send(gw, who, command, response)).position
    except ConflictError:
        if not ids.keyed:
            raise
        # Its event is in the log by now: the artifacts' read model, once it reached the
        # log's end, shows it. (Not a 504 while it cannot, which would be kept for the key:
        # the files after this one are not recorded yet, and every retry would get that
        # answer and never record them.)
        row = await made_before(
            gw,
            ARTIFACTS_PROJECTION,
            "SELECT project_id, session_id, path, sha256, size, position"
            " FROM proj_artifacts.artifacts WHERE id = $1 AND deleted_at IS NULL",
            command.artifact_id,
        )
        sent = (command.project_id, command.session_id, command.path, command.sha256, command.size)
        if row is None or tuple(row)[:5] != sent:
            raise
        return int(row["position"])


@router.get("/v1/projects/{project_id}/artifacts")
async def list_artifacts(
    project_id: Identifier,
    gw: GatewayDep,
    who: PrincipalDep,
    _: ReadPosition,
    paging: Paging,
    session_id: Annotated[Identifier | None, Query()] = None,
    path_prefix: Annotated[Clean | None, Query(max_length=1_000)] = None,
) -> Page[ArtifactOut]:
    await require_role(gw, who, project_id, Role.VIEWER, "project")
    where, args = ["project_id = $1", "deleted_at IS NULL"], [project_id]
    if session_id is not None:
        args.append(session_id)
        where.append(f"session_id = ${len(args)}")
    if path_prefix:
        args.append(path_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%")
        where.append(f"path LIKE ${len(args)}")
    rows = await page(gw.pool, "SELECT * FROM proj_artifacts.artifacts", where, args, paging)
    return page_of(rows, paging.limit, "created_at", _artifact)


async def _session_of(gw: Gateway, project_id: str, session_id: str) -> None:
    """Refuse, before any byte is stored, files for a session of another project."""
    owner = await gw.pool.fetchval(
        "SELECT project_id FROM proj_sessions.sessions WHERE id = $1", session_id
    )
    if owner != project_id:
        raise ApiError(422, f"session {session_id} is not a session of this project")


async def _visible(gw: Gateway, who: Principal, artifact_id: Identifier, needed: Role) -> Any:
    row = await gw.pool.fetchrow(
        "SELECT * FROM proj_artifacts.artifacts WHERE id = $1 AND deleted_at IS NULL",
        artifact_id,
    )
    if row is None:
        raise not_found("artifact")
    await require_role(gw, who, row["project_id"], needed, "artifact")
    return row


@router.get("/v1/artifacts/{artifact_id}")
async def get_artifact(
    artifact_id: Identifier, gw: GatewayDep, who: PrincipalDep, _: ReadPosition
) -> ArtifactOut:
    return _artifact(await _visible(gw, who, artifact_id, Role.VIEWER))


@router.get(
    "/v1/artifacts/{artifact_id}/content",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/octet-stream": {}}, "description": "the bytes"}},
)
async def download(
    artifact_id: Identifier, gw: GatewayDep, who: PrincipalDep, _: ReadPosition
) -> StreamingResponse:
    """The artifact's bytes, streamed."""
    row = await _visible(gw, who, artifact_id, Role.VIEWER)
    js = gw.nc.jetstream()
    try:
        chunks = await open_blob(js, gw.artifacts, gw.artifacts_bucket, row["sha256"])
    except ObjectNotFoundError:
        raise ApiError(404, "the artifact's bytes are not in the store") from None
    return StreamingResponse(
        chunks,
        headers={
            # As stored, `type/subtype`: given as `media_type`, Starlette would add a
            # `charset=utf-8` to text types, an encoding the uploader never declared.
            "Content-Type": media_type(row["content_type"]),
            "Content-Length": str(row["size"]),
            "ETag": f'"{row["sha256"]}"',
            "Content-Disposition": attachment(posixpath.basename(row["path"])),
            # Uploaded bytes are never to be interpreted as a page of this origin.
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "sandbox",
        },
    )


def attachment(filename: str) -> str:
    """A Content-Disposition for `filename` (RFC 6266): an ASCII fallback for old clients and
    the exact UTF-8 name in `filename*`."""
    fallback = "".join(c if " " <= c <= "~" and c not in '"\\%' else "_" for c in filename)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"


@router.delete("/v1/artifacts/{artifact_id}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_artifact(
    artifact_id: Identifier, gw: GatewayDep, who: PrincipalDep, response: Response
) -> None:
    await _visible(gw, who, artifact_id, Role.MEMBER)
    reply = await send(gw, who, DeleteArtifact(artifact_id=artifact_id), response)
    await settle(gw, reply, reads=None)
