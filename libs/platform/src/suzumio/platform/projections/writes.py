"""Folding a batch of events into as few SQL statements as possible.

A projection applies a batch of up to thousands of events in one transaction. Writing each
event's effect as its own statement would cost a round trip per event; instead the effects are
folded per row (inserts, assignments and increments), then each row is written once, and rows
with the same shape of change share one `executemany`.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, cast

from suzumio.platform.db.pool import Connection


def clean(value: Any) -> Any:
    """`value` with NUL characters replaced (U+FFFD), however deep: Postgres text and jsonb
    cannot hold NUL, and a projection must never stall on what a writer let through."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if isinstance(value, dict):
        return {clean(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


class DuplicateRowError(ValueError):
    """An event inserts a row whose key another event of the same batch inserted."""


@dataclass
class _Row:
    inserted: bool = False
    values: dict[str, Any] = field(default_factory=dict)
    increments: dict[str, int] = field(default_factory=dict)


class RowChanges:
    """Changes to rows of one table keyed by `key`, written by `flush` in one pass.

    `insert` starts a new row; `set` assigns columns (the last assignment wins); `incr` adds
    to integer columns. Changes to a row inserted in the same batch fold into its insert.
    A key of several columns (`("session_id", "id")`) takes tuples as keys.
    """

    def __init__(self, table: str, key: str | tuple[str, ...]) -> None:
        self._table = table
        self._key = (key,) if isinstance(key, str) else key
        self._rows: dict[Hashable, _Row] = {}

    def insert(self, key: Hashable, **values: Any) -> None:
        if key in self._rows and self._rows[key].inserted:
            # As the table's key would refuse it were the two in separate batches: a batch's
            # cut must never decide which of the two a projection keeps.
            raise DuplicateRowError(f"{self._table}: a second row with the key {key!r}")
        self._rows[key] = _Row(inserted=True, values={k: clean(v) for k, v in values.items()})

    def set(self, key: Hashable, **values: Any) -> None:
        self._rows.setdefault(key, _Row()).values.update({k: clean(v) for k, v in values.items()})

    def incr(self, key: Hashable, **deltas: int) -> None:
        row = self._rows.setdefault(key, _Row())
        for column, delta in deltas.items():
            if row.inserted:
                row.values[column] = row.values.get(column, 0) + delta
            else:
                row.increments[column] = row.increments.get(column, 0) + delta

    def __len__(self) -> int:
        return len(self._rows)

    async def flush(self, conn: Connection) -> None:
        inserts: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}
        updates: dict[tuple[tuple[str, ...], tuple[str, ...]], list[tuple[Any, ...]]] = {}
        width = len(self._key)
        for key, row in self._rows.items():
            key_values = (key,) if width == 1 else tuple(cast("tuple[Any, ...]", key))
            if row.inserted:
                columns = (*self._key, *sorted(row.values))
                inserts.setdefault(columns, []).append(
                    (*key_values, *(row.values[c] for c in columns[width:]))
                )
            else:
                shape = (tuple(sorted(row.values)), tuple(sorted(row.increments)))
                args = (
                    *key_values,
                    *(row.values[c] for c in shape[0]),
                    *(row.increments[c] for c in shape[1]),
                )
                updates.setdefault(shape, []).append(args)
        for columns, rows in inserts.items():
            placeholders = ", ".join(f"${i}" for i in range(1, len(columns) + 1))
            sql = f"INSERT INTO {self._table} ({', '.join(columns)}) VALUES ({placeholders})"
            await conn.executemany(sql, rows)
        for (assigned, incremented), rows in updates.items():
            parts = [f"{c} = ${i}" for i, c in enumerate(assigned, start=width + 1)]
            offset = width + 1 + len(assigned)
            parts += [f"{c} = {c} + ${i}" for i, c in enumerate(incremented, start=offset)]
            if not parts:
                continue
            where = " AND ".join(f"{c} = ${i}" for i, c in enumerate(self._key, start=1))
            sql = f"UPDATE {self._table} SET {', '.join(parts)} WHERE {where}"
            await conn.executemany(sql, rows)
        self._rows.clear()
