"""Agents: created from JSON or imported from an agent package."""

from __future__ import annotations

import asyncio
import io
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response, status

from suzumio.contracts.commands import CreateAgent, DisableAgent, EnableAgent, UpdateAgent
from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import AssetRef, ModelSpec, Role
from suzumio.gateway.api.deps import (
    GatewayDep,
    MintDep,
    PrincipalDep,
    ReadPosition,
    require_role,
)
from suzumio.gateway.api.models import AgentIn, AgentOut, AgentPatch, DisableIn
from suzumio.gateway.api.pagination import Page, PageRequest, page_of, page_request
from suzumio.gateway.api.problems import ApiError, not_found
from suzumio.gateway.api.routes.common import RESPONSES, send, settle
from suzumio.gateway.packages import Package, PackageError, read_package
from suzumio.gateway.queries.rows import page
from suzumio.gateway.state import Gateway
from suzumio.gateway.uploads import receive_form
from suzumio.platform.bus.objects import put_blob

router = APIRouter(tags=["agents"], responses=RESPONSES)
Paging = Annotated[PageRequest, Depends(page_request)]


def _agent(row: Any) -> AgentOut:
    return AgentOut(
        id=row["id"],
        project_id=row["project_id"],
        name=row["name"],
        role=row["role"],
        prompt=row["prompt"],
        description=row["description"],
        model=ModelSpec.model_validate(row["model"]),
        fallbacks=row["fallbacks"],
        tools=row["tools"],
        toolpacks=row["toolpacks"],
        permissions=row["permissions"],
        env_facts=row["env_facts"],
        assets=row["assets"],
        workspace_mode=row["workspace_mode"],
        runtime_profile=row["runtime_profile"],
        disabled=row["disabled"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


async def _read(gw: Gateway, agent_id: Identifier) -> Any:
    row = await gw.pool.fetchrow("SELECT * FROM proj_agents.agents WHERE id = $1", agent_id)
    if row is None:
        raise not_found("agent")
    return row


async def _visible(gw: Gateway, who: Any, agent_id: Identifier, needed: Role) -> Any:
    row = await _read(gw, agent_id)
    await require_role(gw, who, row["project_id"], needed, "agent")
    return row


@router.post("/v1/projects/{project_id}/agents", status_code=status.HTTP_201_CREATED)
async def create_agent(
    project_id: Identifier,
    body: AgentIn,
    gw: GatewayDep,
    who: PrincipalDep,
    response: Response,
    ids: MintDep,
) -> AgentOut:
    await require_role(gw, who, project_id, Role.ADMIN, "project")
    agent_id = ids("agent")
    fields = body.model_dump()
    command = CreateAgent(project_id=project_id, agent_id=agent_id, **fields)
    location = f"/v1/agents/{agent_id}"
    await settle(gw, await send(gw, who, command, response), reads="agents", location=location)
    response.headers["Location"] = location
    return _agent(await _read(gw, agent_id))


PACKAGE_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["package"],
                    "properties": {
                        "package": {
                            "type": "string",
                            "format": "binary",
                            "description": "agent package: tar, tar.gz or zip",
                        }
                    },
                }
            }
        },
    }
}


async def _package(request: Request, gw: Gateway) -> Package:
    """The agent package of the request's form field `package`, read and checked (else 422)."""
    form = await receive_form(
        request.headers.get("content-type"),
        request.stream(),
        max_file_bytes=gw.settings.max_package_bytes,
        max_total_bytes=gw.settings.max_package_bytes,
        max_files=1,
    )
    try:
        uploaded = next((f for f in form.files if f.name == "package"), None)
        if uploaded is None:
            raise ApiError(422, "send the archive in a form field named 'package'")
        try:
            return await asyncio.to_thread(read_package, uploaded.file.read())
        except PackageError as exc:
            raise ApiError(422, f"not a valid agent package: {exc}") from exc
    finally:
        form.close()


def _assets(package: Package) -> tuple[AssetRef, ...]:
    return tuple(AssetRef(path=a.path, sha256=a.sha256, size=len(a.data)) for a in package.assets)


async def _store_assets(gw: Gateway, package: Package) -> None:
    for asset in package.assets:
        await put_blob(gw.artifacts, asset.sha256, io.BytesIO(asset.data))


@router.post(
    "/v1/projects/{project_id}/agents/import",
    status_code=status.HTTP_201_CREATED,
    openapi_extra=PACKAGE_BODY,
)
async def import_agent(
    project_id: Identifier,
    request: Request,
    gw: GatewayDep,
    who: PrincipalDep,
    response: Response,
    ids: MintDep,
) -> AgentOut:
    """Create an agent from an agent package archive (see docs/agent-packages.md)."""
    await require_role(gw, who, project_id, Role.ADMIN, "project")
    package = await _package(request, gw)
    agent_id = ids("agent")
    # Built (and so checked) before any asset is stored: a refused package leaves nothing.
    command = CreateAgent(
        project_id=project_id, agent_id=agent_id, assets=_assets(package), **package.fields
    )
    await _store_assets(gw, package)
    location = f"/v1/agents/{agent_id}"
    await settle(gw, await send(gw, who, command, response), reads="agents", location=location)
    response.headers["Location"] = location
    return _agent(await _read(gw, agent_id))


@router.post("/v1/agents/{agent_id}/package", openapi_extra=PACKAGE_BODY)
async def update_package(
    agent_id: Identifier, request: Request, gw: GatewayDep, who: PrincipalDep, response: Response
) -> AgentOut:
    """Replace the agent's definition with a new version of its package: every setting the
    package holds, its env facts and its assets (the agent's next activations get them)."""
    await _visible(gw, who, agent_id, Role.ADMIN)
    package = await _package(request, gw)
    fields = package.fields
    # A package names everything it sets: a runtime profile it leaves out is none.
    clear = fields["runtime_profile"] is None
    command = UpdateAgent(
        agent_id=agent_id, assets=_assets(package), clear_runtime_profile=clear, **fields
    )
    await _store_assets(gw, package)
    await settle(gw, await send(gw, who, command, response), reads="agents")
    return _agent(await _read(gw, agent_id))


@router.get("/v1/projects/{project_id}/agents")
async def list_agents(
    project_id: Identifier, gw: GatewayDep, who: PrincipalDep, _: ReadPosition, paging: Paging
) -> Page[AgentOut]:
    await require_role(gw, who, project_id, Role.VIEWER, "project")
    rows = await page(
        gw.pool, "SELECT * FROM proj_agents.agents", ["project_id = $1"], [project_id], paging
    )
    return page_of(rows, paging.limit, "created_at", _agent)


@router.get("/v1/agents/{agent_id}")
async def get_agent(
    agent_id: Identifier, gw: GatewayDep, who: PrincipalDep, _: ReadPosition
) -> AgentOut:
    return _agent(await _visible(gw, who, agent_id, Role.VIEWER))


@router.patch("/v1/agents/{agent_id}")
async def update_agent(
    agent_id: Identifier, body: AgentPatch, gw: GatewayDep, who: PrincipalDep, response: Response
) -> AgentOut:
    await _visible(gw, who, agent_id, Role.ADMIN)
    # `"runtime_profile": null` sets it back to none; a field left out stays as it is.
    clear = "runtime_profile" in body.model_fields_set and body.runtime_profile is None
    command = UpdateAgent(
        agent_id=agent_id, **body.model_dump(exclude_none=True), clear_runtime_profile=clear
    )
    await settle(gw, await send(gw, who, command, response), reads="agents")
    return _agent(await _read(gw, agent_id))


@router.post("/v1/agents/{agent_id}/disable")
async def disable_agent(
    agent_id: Identifier,
    gw: GatewayDep,
    who: PrincipalDep,
    response: Response,
    body: DisableIn | None = None,
) -> AgentOut:
    """A disabled agent keeps its sessions but opens no new ones. The body (a `reason`) may
    be left out."""
    await _visible(gw, who, agent_id, Role.ADMIN)
    reason = body.reason if body is not None else ""
    reply = await send(gw, who, DisableAgent(agent_id=agent_id, reason=reason), response)
    await settle(gw, reply, reads="agents")
    return _agent(await _read(gw, agent_id))


@router.post("/v1/agents/{agent_id}/enable")
async def enable_agent(
    agent_id: Identifier, gw: GatewayDep, who: PrincipalDep, response: Response
) -> AgentOut:
    await _visible(gw, who, agent_id, Role.ADMIN)
    await settle(gw, await send(gw, who, EnableAgent(agent_id=agent_id), response), reads="agents")
    return _agent(await _read(gw, agent_id))
