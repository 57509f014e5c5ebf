"""Users and API keys. Keys are shown once, at creation; only their digests are kept."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response, status

from suzumio.contracts.commands import CommandAccepted, CreateApiKey, CreateUser, RevokeApiKey
from suzumio.contracts.ids import Identifier
from suzumio.gateway.api.deps import (
    AdminDep,
    GatewayDep,
    Mint,
    MintDep,
    PrincipalDep,
    ReadPosition,
)
from suzumio.gateway.api.models import (
    ApiKeyIn,
    ApiKeyOut,
    ApiKeyWithSecret,
    KeyId,
    UserIn,
    UserOut,
    UserWithKey,
)
from suzumio.gateway.api.pagination import Page, PageRequest, page_of, page_request
from suzumio.gateway.api.problems import ApiError, not_found
from suzumio.gateway.api.routes.common import RESPONSES, send, settle
from suzumio.gateway.queries.rows import page
from suzumio.gateway.state import Gateway
from suzumio.platform import apikeys

router = APIRouter(prefix="/v1", tags=["users"], responses=RESPONSES)
Paging = Annotated[PageRequest, Depends(page_request)]


def _user(row: Any) -> UserOut:
    return UserOut(
        id=row["id"],
        name=row["name"],
        email=row["email"],
        admin=row["admin"],
        created_at=row["created_at"],
    )


def _key(row: Any) -> ApiKeyOut:
    return ApiKeyOut(
        key_id=row["key_id"],
        name=row["name"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        revoked_at=row["revoked_at"],
    )


async def _read_user(gw: Gateway, user_id: Identifier) -> Any:
    row = await gw.pool.fetchrow("SELECT * FROM proj_users.users WHERE id = $1", user_id)
    if row is None:
        raise not_found("user")
    return row


@router.post("/users", status_code=status.HTTP_201_CREATED)
async def create_user(
    body: UserIn, gw: GatewayDep, who: AdminDep, response: Response, ids: MintDep
) -> UserWithKey:
    """Create a user (platform admins); the answer holds their first API key, once."""
    user_id, key = ids("user"), apikeys.mint()
    command = CreateUser(
        user_id=user_id,
        name=body.name,
        email=body.email,
        admin=body.admin,
        key_id=key.key_id,
        digest=key.digest,
    )
    reply = await send(gw, who, command, response)
    response.headers["Location"] = f"/v1/users/{user_id}"
    if not await _caught_up(gw, reply):
        return UserWithKey(
            id=user_id,
            name=command.name,
            email=command.email,
            admin=command.admin,
            created_at=datetime.now(UTC),
            api_key=key.plaintext,
        )
    return UserWithKey(**_user(await _read_user(gw, user_id)).model_dump(), api_key=key.plaintext)


async def _caught_up(gw: Gateway, reply: CommandAccepted) -> bool:
    """Whether the read models show the command's effect within the read-your-writes wait.
    A route whose answer holds a new key's secret answers from the command when they do not
    (`created_at` then by this gateway's clock): a 504 would lose the secret for good — the
    key exists, and no retry can show it again."""
    try:
        await settle(gw, reply, reads="users")
    except ApiError as exc:
        if exc.status != 504:
            raise
        return False
    return True


@router.get("/users")
async def list_users(
    gw: GatewayDep, _who: AdminDep, _: ReadPosition, paging: Paging
) -> Page[UserOut]:
    rows = await page(gw.pool, "SELECT * FROM proj_users.users", [], [], paging)
    return page_of(rows, paging.limit, "created_at", _user)


@router.get("/users/{user_id}")
async def get_user(
    user_id: Identifier, gw: GatewayDep, who: PrincipalDep, _: ReadPosition
) -> UserOut:
    """A user: yourself, or anyone for a platform admin."""
    if not who.admin and who.user_id != user_id:
        raise not_found("user")
    return _user(await _read_user(gw, user_id))


@router.get("/me")
async def me(gw: GatewayDep, who: PrincipalDep, _: ReadPosition) -> UserOut:
    return _user(await _read_user(gw, who.user_id))


def _new_key(ids: Mint) -> apikeys.MintedKey:
    """A fresh key; under an `Idempotency-Key` its id is named after the key, as everything
    a keyed POST creates is: a retry whose first answer was lost is then refused (409)
    instead of leaving a second live key whose secret nobody ever saw."""
    key = apikeys.mint()
    if not ids.keyed:
        return key
    key_id = ids("api-key").replace("-", "")  # 32 hex digits: a key id's own alphabet
    secret = key.plaintext.split("_", 2)[2]
    return apikeys.MintedKey(f"{apikeys.PREFIX}_{key_id}_{secret}", key_id, key.digest)


@router.post("/me/api-keys", status_code=status.HTTP_201_CREATED)
async def create_key(
    body: ApiKeyIn, gw: GatewayDep, who: PrincipalDep, response: Response, ids: MintDep
) -> ApiKeyWithSecret:
    """Another API key for yourself; the key is in this answer only."""
    key = _new_key(ids)
    command = CreateApiKey(
        user_id=who.user_id,
        key_id=key.key_id,
        digest=key.digest,
        name=body.name,
        expires_at=body.expires_at,
    )
    reply = await send(gw, who, command, response)
    if not await _caught_up(gw, reply):
        return ApiKeyWithSecret(
            key_id=key.key_id,
            name=command.name,
            created_at=datetime.now(UTC),
            expires_at=command.expires_at,
            revoked_at=None,
            api_key=key.plaintext,
        )
    row = await gw.pool.fetchrow("SELECT * FROM proj_users.api_keys WHERE key_id = $1", key.key_id)
    return ApiKeyWithSecret(**_key(row).model_dump(), api_key=key.plaintext)


@router.get("/me/api-keys")
async def list_keys(gw: GatewayDep, who: PrincipalDep, _: ReadPosition) -> list[ApiKeyOut]:
    rows = await gw.pool.fetch(
        "SELECT * FROM proj_users.api_keys WHERE user_id = $1 ORDER BY created_at, key_id",
        who.user_id,
    )
    return [_key(r) for r in rows]


@router.delete("/me/api-keys/{key_id}", status_code=status.HTTP_204_NO_CONTENT)
async def revoke_key(key_id: KeyId, gw: GatewayDep, who: PrincipalDep, response: Response) -> None:
    """Revoke one of your keys (it stops working within seconds on every gateway)."""
    owner = await gw.pool.fetchval(
        "SELECT user_id FROM proj_users.api_keys WHERE key_id = $1", key_id
    )
    if owner != who.user_id:
        raise not_found("API key")
    reply = await send(gw, who, RevokeApiKey(user_id=who.user_id, key_id=key_id), response)
    await settle(gw, reply, reads=None)
    gw.keys.forget(key_id)
