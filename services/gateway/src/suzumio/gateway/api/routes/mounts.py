"""Mount grants: host directories an agent's sandboxes may mount."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response, status

from suzumio.contracts.commands import GrantMount, RevokeMount
from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import MountMode, Role
from suzumio.gateway.api.deps import (
    GatewayDep,
    MintDep,
    PrincipalDep,
    ReadPosition,
    require_role,
)
from suzumio.gateway.api.models import MountGrantIn, MountGrantOut
from suzumio.gateway.api.problems import not_found
from suzumio.gateway.api.routes.common import RESPONSES, send, settle
from suzumio.gateway.state import Gateway

router = APIRouter(
    prefix="/v1/projects/{project_id}/mount-grants", tags=["mount grants"], responses=RESPONSES
)


def _grant(row: Any) -> MountGrantOut:
    return MountGrantOut(
        id=row["id"],
        project_id=row["project_id"],
        agent_id=row["agent_id"],
        host_path=row["host_path"],
        target=row["target"],
        mode=MountMode(row["mode"]),
        created_at=row["created_at"],
    )


async def _read(gw: Gateway, project_id: Identifier, grant_id: Identifier) -> MountGrantOut:
    row = await gw.pool.fetchrow(
        "SELECT * FROM proj_projects.mount_grants WHERE id = $1 AND project_id = $2",
        grant_id,
        project_id,
    )
    if row is None:
        raise not_found("mount grant")
    return _grant(row)


@router.post("", status_code=status.HTTP_201_CREATED)
async def grant(
    project_id: Identifier,
    body: MountGrantIn,
    gw: GatewayDep,
    who: PrincipalDep,
    response: Response,
    ids: MintDep,
) -> MountGrantOut:
    """Allow sandboxes of the project (or of one agent) to mount a host directory. The path
    must be an existing directory under an allowed root once symlinks are resolved."""
    await require_role(gw, who, project_id, Role.ADMIN, "project")
    grant_id = ids("grant")
    command = GrantMount(
        project_id=project_id,
        grant_id=grant_id,
        host_path=body.host_path,
        target=body.target,
        mode=body.mode,
        agent_id=body.agent_id,
    )
    location = f"/v1/projects/{project_id}/mount-grants/{grant_id}"
    await settle(gw, await send(gw, who, command, response), reads="projects", location=location)
    response.headers["Location"] = location
    return await _read(gw, project_id, grant_id)


@router.get("")
async def list_grants(
    project_id: Identifier, gw: GatewayDep, who: PrincipalDep, _: ReadPosition
) -> list[MountGrantOut]:
    await require_role(gw, who, project_id, Role.VIEWER, "project")
    rows = await gw.pool.fetch(
        "SELECT * FROM proj_projects.mount_grants WHERE project_id = $1 ORDER BY created_at, id",
        project_id,
    )
    return [_grant(r) for r in rows]


@router.get("/{grant_id}")
async def get_grant(
    project_id: Identifier, grant_id: Identifier, gw: GatewayDep, who: PrincipalDep, _: ReadPosition
) -> MountGrantOut:
    await require_role(gw, who, project_id, Role.VIEWER, "project")
    return await _read(gw, project_id, grant_id)


@router.delete("/{grant_id}", status_code=status.HTTP_204_NO_CONTENT)
async def revoke(
    project_id: Identifier,
    grant_id: Identifier,
    gw: GatewayDep,
    who: PrincipalDep,
    response: Response,
) -> None:
    await require_role(gw, who, project_id, Role.ADMIN, "project")
    reply = await send(gw, who, RevokeMount(project_id=project_id, grant_id=grant_id), response)
    await settle(gw, reply, reads=None)
