"""Small helpers for paged reads."""

from __future__ import annotations

from typing import Any

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
