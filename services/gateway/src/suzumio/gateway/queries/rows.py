"""Small helpers for paged reads."""

from __future__ import annotations

from typing import Any

import asyncpg

from suzumio.gateway.api.pagination import PageRequest, cursor_value
from suzumio.platform.db.pool import Pool


async def page(
    pool: Pool,
    select: str,
    where: list[str],
    args: list[Any],
    request: PageRequest,
    *,
    sort: str = "created_at",
    descending: bool = True,
) -> list[Any]:
    """Rows of `select` (which must expose `id` and the sort column), one page of them.

    The sort column and id order the rows; the cursor resumes strictly after the last one.
    """
    conditions = list(where)
    params = list(args)
    op = "<" if descending else ">"
    if request.after is not None:
        sort_value, row_id = request.after
        params += [cursor_value(sort, sort_value), row_id]
        conditions.append(f"({sort}, id) {op} (${len(params) - 1}, ${len(params)})")
    order = "DESC" if descending else "ASC"
    params.append(request.limit + 1)
    sql = (  # only fragments written in this package are put together here
        f"SELECT * FROM ({select}) t"  # noqa: S608
        + (f" WHERE {' AND '.join(conditions)}" if conditions else "")
        + f" ORDER BY {sort} {order}, id {order} LIMIT ${len(params)}"
    )
    return list(await pool.fetch(sql, *params))


async def page_in_log_order(
    pool: Pool,
    select: str,
    where: list[str],
    args: list[Any],
    request: PageRequest,
    *,
    sort: str,
    before: str,
) -> tuple[list[Any], str]:
    """Oldest first by `sort` (a row's first position in the log), and the column paged by;
    by `before` (its time) where the read model is of the release before that column —
    mid-upgrade, until the rebuilt one is swapped in (a cursor of the other order is a 422,
    as any the API did not give out)."""
    by_time = request.after is not None and isinstance(request.after[0], str)
    if not by_time:  # a cursor given by time was given while the tables were those before
        try:
            rows = await page(pool, select, where, args, request, sort=sort, descending=False)
        except asyncpg.UndefinedColumnError:
            pass
        else:
            return rows, sort
    return await page(pool, select, where, args, request, sort=before, descending=False), before
