"""Projects, their members, runtime profiles and providers."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response, status

from suzumio.contracts.commands import (
    ChangeProjectLimits,
    CreateProject,
    RemoveMember,
    RemoveProvider,
    RemoveRuntimeProfile,
    RenameProject,
    SetMember,
    SetProvider,
    SetRuntimeProfile,
)
from suzumio.contracts.errors import ConflictError
from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import ProjectLimits, ProviderSpec, Role, RuntimeProfileSpec, Slug
from suzumio.gateway.api.auth import Principal
from suzumio.gateway.api.deps import (
    MEMBERS_PROJECTION,
    GatewayDep,
    MintDep,
    PrincipalDep,
    ReadPosition,
    require_role,
    role_as_the_log_has_it,
    written,
)
from suzumio.gateway.api.models import (
    MemberIn,
    MemberOut,
    ProjectIn,
    ProjectOut,
    ProjectPatch,
    ProviderIn,
    ProviderOut,
    RuntimeProfileOut,
)
from suzumio.gateway.api.pagination import Page, PageRequest, page_of, page_request
from suzumio.gateway.api.problems import ApiError, not_found
from suzumio.gateway.api.routes.common import RESPONSES, made_before, send, settle, settled
from suzumio.gateway.queries.rows import page
from suzumio.gateway.state import Gateway
from suzumio.platform.logging import redact_text

router = APIRouter(prefix="/v1/projects", tags=["projects"], responses=RESPONSES)
Paging = Annotated[PageRequest, Depends(page_request)]
# A platform admin sees every project, as an owner would.
PROJECT_SQL = (
    "SELECT p.*, coalesce(m.role, 'owner') AS role FROM proj_projects.projects p"
    " LEFT JOIN proj_projects.members m ON m.project_id = p.id AND m.user_id = $1"
)
MEMBER_PROJECTS_SQL = (
    "SELECT p.*, m.role FROM proj_projects.projects p"
    " JOIN proj_projects.members m ON m.project_id = p.id AND m.user_id = $1"
)


def _project(row: Any) -> ProjectOut:
    limits = ProjectLimits(max_concurrent_activations=row["max_concurrent_activations"])
    return ProjectOut(
        id=row["id"],
        name=row["name"],
        owner_id=row["owner_id"],
        limits=limits,
        role=Role(row["role"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


async def _read_project(
    gw: Gateway, who: Principal, project_id: Identifier, role: Role
) -> ProjectOut:
    """The project as the caller sees it; a member's `role` is the one the route's guard
    found (as the log has it while the projects' model is frozen: the frozen row may show
    another, or none, which reads as a platform admin's `owner`)."""
    row = await gw.pool.fetchrow(PROJECT_SQL + " WHERE p.id = $2", who.user_id, project_id)
    if row is None:
        raise not_found("project")
    project = _project(row)
    return project if who.admin else project.model_copy(update={"role": role})


@router.post("", status_code=status.HTTP_201_CREATED)
async def create_project(
    body: ProjectIn, gw: GatewayDep, who: PrincipalDep, response: Response, ids: MintDep
) -> ProjectOut:
    """Create a project; the caller becomes its owner."""
    project_id = ids("project")
    location = f"/v1/projects/{project_id}"
    command = CreateProject(project_id=project_id, name=body.name, limits=body.limits)
    try:
        await settle(
            gw, await send(gw, who, command, response), reads="projects", location=location
        )
    except ConflictError:
        if not ids.keyed:
            raise
        # A retry whose first attempt made it (its answer lost): as the first answered.
        row = await made_before(
            gw, "projects", "SELECT * FROM proj_projects.projects WHERE id = $1", project_id
        )
        if row is None or (row["name"], row["owner_id"]) != (body.name, who.user_id):
            raise
        written(response, int(row["position"]))
    response.headers["Location"] = location
    return await _read_project(gw, who, project_id, Role.OWNER)


@router.get("")
async def list_projects(
    gw: GatewayDep, who: PrincipalDep, _: ReadPosition, paging: Paging
) -> Page[ProjectOut]:
    """The projects the caller is a member of (all of them, for a platform admin)."""
    select = PROJECT_SQL if who.admin else MEMBER_PROJECTS_SQL
    rows = await page(gw.pool, select, [], [who.user_id], paging)
    listed = page_of(rows, paging.limit, "created_at", _project)
    # While the projects' model is frozen, each membership as the log has it (one removed
    # since is left out; the page may then be short, its cursor unchanged).
    roles = await asyncio.gather(
        *(role_as_the_log_has_it(gw, who, p.id, p.role) for p in listed.items)
    )
    items = [
        p.model_copy(update={"role": role})
        for p, role in zip(listed.items, roles, strict=True)
        if role is not None
    ]
    return listed.model_copy(update={"items": items})


@router.get("/{project_id}")
async def get_project(
    project_id: Identifier, gw: GatewayDep, who: PrincipalDep, _: ReadPosition
) -> ProjectOut:
    role = await require_role(gw, who, project_id, Role.VIEWER, "project")
    return await _read_project(gw, who, project_id, role)


@router.patch("/{project_id}")
async def update_project(
    project_id: Identifier,
    body: ProjectPatch,
    gw: GatewayDep,
    who: PrincipalDep,
    response: Response,
) -> ProjectOut:
    """Rename the project or change its limits (admins)."""
    role = await require_role(gw, who, project_id, Role.ADMIN, "project")
    commands: list[RenameProject | ChangeProjectLimits] = []  # both built before either goes
    if body.name is not None:
        commands.append(RenameProject(project_id=project_id, name=body.name))
    if body.limits is not None:
        commands.append(ChangeProjectLimits(project_id=project_id, limits=body.limits))
    position = 0
    for command in commands:
        position = max(position, (await send(gw, who, command, response)).position)
    if position:
        response.headers["Suzumio-Position"] = str(position)
        await settled(gw, position, reads="projects")
    return await _read_project(gw, who, project_id, role)


# -- members ----------------------------------------------------------------------------------
def _member(row: Any) -> MemberOut:
    return MemberOut(user_id=row["user_id"], role=Role(row["role"]), since=row["since"])


@router.get("/{project_id}/members")
async def list_members(
    project_id: Identifier, gw: GatewayDep, who: PrincipalDep, _: ReadPosition
) -> list[MemberOut]:
    await require_role(gw, who, project_id, Role.VIEWER, "project")
    rows = await gw.pool.fetch(
        "SELECT * FROM proj_projects.members WHERE project_id = $1 ORDER BY since, user_id",
        project_id,
    )
    return [_member(r) for r in rows]


@router.put("/{project_id}/members/{user_id}")
async def set_member(
    project_id: Identifier,
    user_id: Identifier,
    body: MemberIn,
    gw: GatewayDep,
    who: PrincipalDep,
    response: Response,
) -> MemberOut:
    """Add a user to the project or change their role (admins; owners for owner roles)."""
    await require_role(gw, who, project_id, Role.ADMIN, "project")
    try:
        reply = await send(
            gw, who, SetMember(project_id=project_id, user_id=user_id, role=body.role), response
        )
    finally:  # asked of the log while frozen: changed at once here (a timeout may have)
        gw.roles.forget((project_id, user_id))
    # While the members' model is frozen, answered from the command (below), not a 504.
    await settle(gw, reply, reads=None)
    row = await gw.pool.fetchrow(
        "SELECT * FROM proj_projects.members WHERE project_id = $1 AND user_id = $2",
        project_id,
        user_id,
    )
    if not gw.positions.serving(MEMBERS_PROJECTION):
        # Frozen (rebuilt for a new version): the row, if any, is from before the change the
        # log now holds. A 404 told the caller a membership it had just made was missing.
        since = row["since"] if row is not None else datetime.now(UTC)
        return MemberOut(user_id=user_id, role=body.role, since=since)
    if row is None:
        raise not_found("member")
    return _member(row)


@router.delete("/{project_id}/members/{user_id}", status_code=status.HTTP_204_NO_CONTENT)
async def remove_member(
    project_id: Identifier,
    user_id: Identifier,
    gw: GatewayDep,
    who: PrincipalDep,
    response: Response,
) -> None:
    """Remove a member (admins), or leave the project yourself."""
    await require_role(gw, who, project_id, Role.VIEWER, "project")
    try:
        reply = await send(gw, who, RemoveMember(project_id=project_id, user_id=user_id), response)
    finally:  # asked of the log while frozen: changed at once here (a timeout may have)
        gw.roles.forget((project_id, user_id))
    await settle(gw, reply, reads=None)


# -- runtime profiles -------------------------------------------------------------------------
def _profile(row: Any) -> RuntimeProfileOut:
    return RuntimeProfileOut(
        name=row["name"],
        spec=RuntimeProfileSpec.model_validate(row["spec"]),
        updated_at=row["updated_at"],
    )


@router.get("/{project_id}/runtime-profiles", tags=["runtime profiles"])
async def list_profiles(
    project_id: Identifier, gw: GatewayDep, who: PrincipalDep, _: ReadPosition
) -> list[RuntimeProfileOut]:
    await require_role(gw, who, project_id, Role.VIEWER, "project")
    rows = await gw.pool.fetch(
        "SELECT * FROM proj_projects.runtime_profiles WHERE project_id = $1 ORDER BY name",
        project_id,
    )
    return [_profile(r) for r in rows]


async def _read_profile(gw: Gateway, project_id: Identifier, name: str) -> RuntimeProfileOut:
    row = await gw.pool.fetchrow(
        "SELECT * FROM proj_projects.runtime_profiles WHERE project_id = $1 AND name = $2",
        project_id,
        name,
    )
    if row is None:
        raise not_found("runtime profile")
    return _profile(row)


@router.get("/{project_id}/runtime-profiles/{name}", tags=["runtime profiles"])
async def get_profile(
    project_id: Identifier, name: Slug, gw: GatewayDep, who: PrincipalDep, _: ReadPosition
) -> RuntimeProfileOut:
    await require_role(gw, who, project_id, Role.VIEWER, "project")
    return await _read_profile(gw, project_id, name)


@router.put("/{project_id}/runtime-profiles/{name}", tags=["runtime profiles"])
async def put_profile(
    project_id: Identifier,
    name: Slug,
    body: RuntimeProfileSpec,
    gw: GatewayDep,
    who: PrincipalDep,
    response: Response,
) -> RuntimeProfileOut:
    """Create or replace a runtime profile: how agents' sandboxes are started."""
    await require_role(gw, who, project_id, Role.ADMIN, "project")
    reply = await send(
        gw, who, SetRuntimeProfile(project_id=project_id, name=name, spec=body), response
    )
    await settle(gw, reply, reads="projects")
    return await _read_profile(gw, project_id, name)


@router.delete(
    "/{project_id}/runtime-profiles/{name}",
    tags=["runtime profiles"],
    status_code=status.HTTP_204_NO_CONTENT,
)
async def delete_profile(
    project_id: Identifier,
    name: Slug,
    gw: GatewayDep,
    who: PrincipalDep,
    response: Response,
    _: ReadPosition,
) -> None:
    """Remove a runtime profile. One an agent of the project names is refused (409, naming
    those agents): its activations would fail, unplanned, until the agent is changed."""
    await require_role(gw, who, project_id, Role.ADMIN, "project")
    await _refuse_if_used(gw, project_id, "runtime profile", name, _NAMING_PROFILE)
    reply = await send(gw, who, RemoveRuntimeProfile(project_id=project_id, name=name), response)
    await settle(gw, reply, reads=None)


# The agents of a project that name a runtime profile, or provider settings ($2).
_NAMING_PROFILE = "runtime_profile = $2"
_NAMING_PROVIDER = (
    "(model->>'provider' = $2"
    " OR fallbacks @> jsonb_build_array(jsonb_build_object('provider', $2::text)))"
)
_NAMED_AT_MOST = 5


async def _refuse_if_used(gw: Gateway, project_id: str, what: str, name: str, naming: str) -> None:
    """409 if an agent of the project names `name` (as the read model has them: an agent
    changed at the same moment may still slip through, and its activations then fail as
    unplanned, saying why)."""
    rows = await gw.pool.fetch(
        f"SELECT name FROM proj_agents.agents WHERE project_id = $1 AND {naming}"  # noqa: S608
        f" ORDER BY name LIMIT {_NAMED_AT_MOST + 1}",
        project_id,
        name,
    )
    if rows:
        names = ", ".join(repr(r["name"]) for r in rows[:_NAMED_AT_MOST])
        more = " and more" if len(rows) > _NAMED_AT_MOST else ""
        raise ApiError(
            409,
            f"{what} {name!r} is used by agent {names}{more}: change them first",
            code="conflict",
        )


# -- providers ------------------------------------------------------------------------------
def _provider(row: Any) -> ProviderOut:
    return ProviderOut(
        name=row["name"],
        kind=row["kind"],
        base_url=redact_text(row["base_url"]),  # one stored before such URLs were refused
        model=row["model"],
        fallbacks=row["fallbacks"],
        api_key_set=row["api_key_set"],
        updated_at=row["updated_at"],
    )


@router.get("/{project_id}/providers", tags=["providers"])
async def list_providers(
    project_id: Identifier, gw: GatewayDep, who: PrincipalDep, _: ReadPosition
) -> list[ProviderOut]:
    await require_role(gw, who, project_id, Role.VIEWER, "project")
    rows = await gw.pool.fetch(
        "SELECT * FROM proj_projects.providers WHERE project_id = $1 ORDER BY name", project_id
    )
    return [_provider(r) for r in rows]


async def _read_provider(gw: Gateway, project_id: Identifier, name: str) -> ProviderOut:
    row = await gw.pool.fetchrow(
        "SELECT * FROM proj_projects.providers WHERE project_id = $1 AND name = $2",
        project_id,
        name,
    )
    if row is None:
        raise not_found("provider")
    return _provider(row)


@router.get("/{project_id}/providers/{name}", tags=["providers"])
async def get_provider(
    project_id: Identifier, name: Slug, gw: GatewayDep, who: PrincipalDep, _: ReadPosition
) -> ProviderOut:
    await require_role(gw, who, project_id, Role.VIEWER, "project")
    return await _read_provider(gw, project_id, name)


@router.put("/{project_id}/providers/{name}", tags=["providers"])
async def put_provider(
    project_id: Identifier,
    name: Slug,
    body: ProviderIn,
    gw: GatewayDep,
    who: PrincipalDep,
    response: Response,
) -> ProviderOut:
    """Create or replace provider settings. The API key is sealed here, at the edge, with the
    platform's secret key: it is never returned, logged, or stored in the clear."""
    await require_role(gw, who, project_id, Role.ADMIN, "project")
    plaintext = body.api_key.get_secret_value() if body.api_key else None
    spec = ProviderSpec(
        kind=body.kind,
        base_url=body.base_url,
        model=body.model,
        fallbacks=tuple(body.fallbacks),
        api_key=gw.secrets.seal(plaintext) if plaintext else None,
    )
    command = SetProvider(
        project_id=project_id,
        name=name,
        spec=spec,
        keep_api_key=plaintext is None and not body.clear_api_key,
    )
    await settle(gw, await send(gw, who, command, response), reads="projects")
    return await _read_provider(gw, project_id, name)


@router.delete(
    "/{project_id}/providers/{name}", tags=["providers"], status_code=status.HTTP_204_NO_CONTENT
)
async def delete_provider(
    project_id: Identifier,
    name: Slug,
    gw: GatewayDep,
    who: PrincipalDep,
    response: Response,
    _: ReadPosition,
) -> None:
    """Remove provider settings. Ones an agent of the project names (as its model's provider
    or a fallback's) are refused (409, naming those agents)."""
    await require_role(gw, who, project_id, Role.ADMIN, "project")
    await _refuse_if_used(gw, project_id, "provider", name, _NAMING_PROVIDER)
    reply = await send(gw, who, RemoveProvider(project_id=project_id, name=name), response)
    await settle(gw, reply, reads=None)
