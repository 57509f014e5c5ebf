"""Cursor pagination: `?limit=&cursor=`, answered with `{items, next_cursor}`.

A cursor is an opaque token naming the last row a page ended on (its sort key and id), so
pages stay stable while rows are added.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Generic, TypeVar

from fastapi import Query
from pydantic import BaseModel, Field

from suzumio.gateway.api.problems import ApiError

T = TypeVar("T")
MAX_LIMIT = 200
FORGED = "the cursor is not one this API gave out"


class Page(BaseModel, Generic[T]):
    items: list[T]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null: end")


class PageRequest(BaseModel):
    limit: int
    after: tuple[Any, str] | None  # (sort key, id) of the last row already seen


async def page_request(
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="page size")] = 50,
    cursor: Annotated[str | None, Query(max_length=500, description="from `next_cursor`")] = None,
) -> PageRequest:
    return PageRequest(limit=limit, after=decode_cursor(cursor) if cursor else None)


def encode_cursor(sort_key: Any, row_id: str) -> str:
    value = sort_key.isoformat() if isinstance(sort_key, datetime) else sort_key
    raw = json.dumps([value, row_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[Any, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        sort_key, row_id = json.loads(raw)
    except (ValueError, TypeError) as exc:
        raise ApiError(422, FORGED) from exc
    if not _storable(row_id):
        raise ApiError(422, FORGED)
    return sort_key, row_id


def _storable(value: Any) -> bool:
    """Text Postgres can take as a parameter: no NUL, and UTF-8 (JSON's `\\ud800` escapes
    decode to lone surrogates, which the driver cannot encode: a 500, not the client's 422)."""
    if not isinstance(value, str) or "\x00" in value:
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


DATE_SORTS = frozenset({"created_at", "opened_at", "requested_at", "since", "started_at"})
# Each integer sort column's range: a value past its column's type is refused by the driver
# (a 500), so it is the client's 422 here. `version` columns are `integer`, `position` `bigint`.
_BIGINT = range(-(2**63), 2**63)
INT_SORTS = {
    "version": range(-(2**31), 2**31),
    "position": _BIGINT,
    "started_position": _BIGINT,
    "created_position": _BIGINT,
}


def cursor_value(sort: str, value: Any) -> Any:
    """The cursor's sort value as the sort column's type; a forged cursor whose value the
    column cannot hold is a 422, not a database error."""
    if sort in DATE_SORTS:
        return _moment(value)
    if sort in INT_SORTS:
        if type(value) is not int or value not in INT_SORTS[sort]:
            raise ApiError(422, FORGED)
        return value
    if not _storable(value):
        raise ApiError(422, FORGED)
    return value


def _moment(value: Any) -> datetime:
    try:
        moment = datetime.fromisoformat(value)
        # The driver converts to UTC too, and a year that leaves 1..9999 on the way raises
        # there (a 500): convert here, where it is the client's error.
        utc = moment.astimezone(UTC) if moment.tzinfo is not None else None
    except (TypeError, ValueError, OverflowError) as exc:
        raise ApiError(422, FORGED) from exc
    if utc is None:
        raise ApiError(422, FORGED)
    return utc


def page_of(rows: Sequence[Any], limit: int, sort_key: str, build: Any) -> Page[Any]:
    """The page for `rows` fetched with LIMIT limit+1 (the extra row says: there is more)."""
    items = [build(r) for r in rows[:limit]]
    more = len(rows) > limit
    last = rows[limit - 1] if more else None
    return Page(
        items=items, next_cursor=encode_cursor(last[sort_key], last["id"]) if last else None
    )
