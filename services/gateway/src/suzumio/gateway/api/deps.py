"""Dependencies of the routes, as `Annotated` aliases (FastAPI's full-stack template style)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import Depends, Header, Query, Request, Response
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from suzumio.contracts.commands import CheckApiKey, CheckProjectRole, Command
from suzumio.contracts.errors import CommandError
from suzumio.contracts.ids import derived_id, new_id
from suzumio.contracts.values import Role
from suzumio.gateway.api.auth import KEYS_PROJECTION, Principal
from suzumio.gateway.api.problems import ApiError, not_found
from suzumio.gateway.state import Gateway
from suzumio.platform import apikeys
from suzumio.platform.bus.jsapi import stream_last_seq

GATEWAY_ACTOR = "system:gateway"  # who asks the session service what the log says
CHECK_TIMEOUT = 2.0  # a request waits on a check asked of the log; a 503 says to try again
FIRST_READ_WAIT = 2.0  # for the read models' positions, at start; asked the log after that
MEMBERS_PROJECTION = "projects"  # the read model memberships are read from (`proj_projects`)
POSITION_HEADER = "Suzumio-Position"
MIN_POSITION_HEADER = "Suzumio-Min-Position"

_bearer = HTTPBearer(auto_error=False, description="an API key: `Bearer szm_...`")
_api_key = APIKeyHeader(name="X-API-Key", auto_error=False, description="an API key")


async def gateway(request: Request) -> Gateway:
    # async: FastAPI runs a plain `def` dependency on its thread pool, a thread hop per request
    gw: Gateway = request.app.state.gateway
    return gw


GatewayDep = Annotated[Gateway, Depends(gateway)]


async def authenticate(gw: Gateway, key: str | None) -> Principal:
    if not key:
        raise ApiError(401, "an API key is required", headers={"WWW-Authenticate": "Bearer"})
    if apikeys.parse(key) is None:  # no read model, however far it got, could hold it
        raise ApiError(401, "the API key is not valid", headers={"WWW-Authenticate": "Bearer"})
    # How far the keys' read model got, taken before it is read: taken after, a key the
    # projector stored meanwhile read as missing from a model then up to date — a 401 for a
    # good key (seen once in CI, a fresh stack's admin key on a NATS cluster).
    reflected = gw.positions.position_of(KEYS_PROJECTION)
    principal = await gw.keys.principal(key)
    lagging = principal is None and reflected < (end := await _log_end(gw))
    if lagging:
        # A key created a moment ago may not be in the read model yet: let it catch up, as
        # long as a client's own writes are waited for (a fresh gateway's projector, on a
        # loaded machine, took more than the 2 s this once was). Only while the keys' own
        # read model lags: a wrong key is refused at once when it is up to date, whatever
        # another read model's lag.
        timeout = gw.settings.read_your_writes_timeout
        caught_up = await gw.positions.wait_for(end, timeout, projection=KEYS_PROJECTION)
        principal = await gw.keys.principal(key, refresh=True)
        if principal is None and not caught_up:
            # Still behind: the key may well be in the part not read yet. Unknown is not
            # invalid — a 401 would tell a client its good key is wrong.
            raise ApiError(
                503,
                "the API keys' read model is catching up; try again",
                headers={"Retry-After": "1"},
            )
    if principal is not None:
        principal = await _as_the_log_has_it(gw, principal)
    if principal is None:
        raise ApiError(401, "the API key is not valid", headers={"WWW-Authenticate": "Bearer"})
    return principal


async def _as_the_log_has_it(
    gw: Gateway, principal: Principal, *, refresh: bool = False
) -> Principal | None:
    """`principal` as it stands: while the keys' read model is not serving (rebuilt for a new
    version, or left to another release mid-upgrade), its frozen tables still show a key
    revoked since as usable — the key is then checked against the log, by the service that
    owns users."""
    # What the watcher read, once it has (a moment after the gateway starts): before, every
    # request would ask the log.
    await gw.positions.first_read(FIRST_READ_WAIT)
    if gw.positions.serving(KEYS_PROJECTION):
        return principal

    async def check(p: Principal) -> tuple[bool, bool]:
        asked = CheckApiKey(user_id=p.user_id, key_id=p.key_id)
        result = await _ask_the_log(gw, asked, "the API keys'", "the key")
        return result.get("usable") is True, result.get("admin") is True

    return await gw.keys.as_the_log_has_it(principal, check, refresh=refresh)


async def _ask_the_log(gw: Gateway, command: Command, model: str, what: str) -> dict[str, Any]:
    """The answer of a check asked of the log (`CheckApiKey`, `CheckProjectRole`) while
    `model` (the read model's name, for the message) is frozen. Unanswered, or refused by a
    session service of a release without the command (mid-upgrade, the only time such
    checks are made), it is a 503: not the caller's fault."""
    try:
        reply = await gw.commands.send(
            command, actor=GATEWAY_ACTOR, timeout=min(gw.settings.command_timeout, CHECK_TIMEOUT)
        )
    except CommandError as exc:
        raise ApiError(
            503,
            f"{model} read model is being rebuilt, and {what} could not be checked against the"
            " log; try again",
            headers={"Retry-After": "1"},
        ) from exc
    return reply.result


def presented_key(headers: Mapping[str, str], access_token: str | None = None) -> str | None:
    """The API key a request carries: `Authorization: Bearer`, `X-API-Key`, or (for
    WebSockets, whose browser API cannot set headers) an `access_token` query parameter."""
    scheme, _, credentials = headers.get("authorization", "").partition(" ")
    bearer = credentials.strip() if scheme.lower() == "bearer" else ""
    return bearer or headers.get("x-api-key") or access_token


async def still_allowed(gw: Gateway, key: str | None) -> Principal:
    """The key's principal, checked against the read model now (not the cache): for
    long-lived connections that must end when the key is revoked."""
    principal = await gw.keys.principal(key, refresh=True) if key else None
    if principal is not None:
        principal = await _as_the_log_has_it(gw, principal, refresh=True)
    if principal is None:
        raise ApiError(401, "the API key is no longer valid")
    return principal


class Mint:
    """Ids for what a POST creates: fresh ones, or with an `Idempotency-Key` ones derived
    from it (its slot), so that every attempt of the request names the same aggregates."""

    def __init__(self, slot: str | None) -> None:
        self._slot = slot

    def __call__(self, purpose: str) -> str:
        return derived_id("idempotency", self._slot, purpose) if self._slot else new_id()

    @property
    def keyed(self) -> bool:
        """Whether the request carries an `Idempotency-Key` (ids are derived from it)."""
        return self._slot is not None


async def mint(request: Request) -> Mint:
    slot = getattr(request.state, "idempotency_slot", None)
    return Mint(slot if isinstance(slot, str) else None)


MintDep = Annotated[Mint, Depends(mint)]


async def _log_end(gw: Gateway) -> int:
    return await stream_last_seq(gw.nc, gw.topology.events_stream)


async def principal(
    gw: GatewayDep,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    api_key: Annotated[str | None, Depends(_api_key)],
) -> Principal:
    return await authenticate(gw, bearer.credentials if bearer else api_key)


PrincipalDep = Annotated[Principal, Depends(principal)]


async def read_position(
    gw: GatewayDep,
    response: Response,
    min_position: Annotated[
        int | None,
        Query(ge=0, description="wait until the read models reflect this log position"),
    ] = None,
    header: Annotated[int | None, Header(alias=MIN_POSITION_HEADER, ge=0)] = None,
) -> int:
    """Read-your-writes: waits for the position a write answered with, then reads."""
    wanted = max(min_position or 0, header or 0)
    if wanted > gw.positions.position and wanted > await _log_end(gw):
        raise ApiError(422, f"position {wanted} is beyond the end of the log")
    if wanted and not await gw.positions.wait_for(wanted, gw.settings.read_your_writes_timeout):
        raise ApiError(504, f"the read models have not reached position {wanted} yet")
    response.headers[POSITION_HEADER] = str(gw.positions.position)
    return gw.positions.position


ReadPosition = Annotated[int, Depends(read_position)]


async def require_admin(who: PrincipalDep) -> Principal:
    if not who.admin:
        raise ApiError(403, "only a platform admin may do this")
    return who


AdminDep = Annotated[Principal, Depends(require_admin)]


async def role_in_project(gw: Gateway, who: Principal, project_id: str) -> Role | None:
    if who.admin:
        exists = await gw.pool.fetchval(
            "SELECT true FROM proj_projects.projects WHERE id = $1", project_id
        )
        return Role.OWNER if exists else None
    role = await gw.pool.fetchval(
        "SELECT role FROM proj_projects.members WHERE project_id = $1 AND user_id = $2",
        project_id,
        who.user_id,
    )
    return await role_as_the_log_has_it(gw, who, project_id, Role(role) if role else None)


async def role_as_the_log_has_it(
    gw: Gateway, who: Principal, project_id: str, role: Role | None
) -> Role | None:
    """`role` (read from the projects' read model) as it stands: while that model is not
    serving, its frozen tables still show a member removed since (or miss one added since),
    so the role is asked of the log, by the service that owns projects. A platform admin's
    does not depend on membership."""
    if who.admin:
        return role
    await gw.positions.first_read(FIRST_READ_WAIT)
    if gw.positions.serving(MEMBERS_PROJECTION):
        return role

    # Only of a project the frozen model shows (one made since has nothing there to read):
    # else any caller could make every made-up id a question to the session service.
    known = await gw.pool.fetchval(
        "SELECT true FROM proj_projects.projects WHERE id = $1", project_id
    )
    if not known:
        return None

    async def ask() -> Role | None:
        asked = CheckProjectRole(project_id=project_id, user_id=who.user_id)
        value = (await _ask_the_log(gw, asked, "the projects'", "the membership")).get("role")
        return Role(value) if value in {r.value for r in Role} else None

    return await gw.roles.get((project_id, who.user_id), ask)


async def require_role(
    gw: Gateway, who: Principal, project_id: str, needed: Role, what: str
) -> Role:
    """The caller's role in the project if at least `needed`: 404 when the caller cannot see
    the project at all (exactly like a missing object), 403 when they see it but may not."""
    return judge(await role_in_project(gw, who, project_id), needed, what)


def judge(role: Role | None, needed: Role, what: str) -> Role:
    if role is None:
        raise not_found(what)
    if not role.at_least(needed):
        raise ApiError(403, f"a {needed.value} of the project may do this; you are {role.value}")
    return role


def written(response: Response, position: int) -> None:
    """Tell the client where its write is in the log (pass it back as `min_position`)."""
    if position:
        response.headers[POSITION_HEADER] = str(position)
