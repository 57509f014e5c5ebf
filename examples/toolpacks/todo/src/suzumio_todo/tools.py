"""Runner-side handlers of `todo.add` and `todo.list`.

The list lives in `<workspace>/session/todo.json`, the session-level state a runner keeps
between activations (DESIGN.md §7). A write goes to a temporary file in the same directory and
replaces the list in one rename, so a killed sandbox leaves the old list or the new one, never
half of one. Handlers need only the context's `workspace`, so this module imports nothing of
the runner.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_ITEMS = 1_000


class HasWorkspace(Protocol):
    """What a handler uses of the runner's `ToolContext`."""

    @property
    def workspace(self) -> Path: ...


class Item(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    n: int = Field(ge=1)
    text: str
    added_at: datetime


class TodoList(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    items: tuple[Item, ...] = ()


class AddArguments(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=True)

    text: str = Field(min_length=1, max_length=500)


def todo_path(workspace: Path) -> Path:
    return workspace / "session" / "todo.json"


def load(path: Path) -> TodoList:
    try:
        return TodoList.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return TodoList()
    except ValidationError:
        raise ValueError(f"{path.name} is not a todo list; not touching it") from None


def save(path: Path, todo: TodoList) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(todo.model_dump_json(indent=2))
            out.flush()
            os.fsync(out.fileno())
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def added(workspace: Path, text: str, now: datetime) -> Item:
    path = todo_path(workspace)
    todo = load(path)
    if len(todo.items) >= MAX_ITEMS:
        raise ValueError(f"the todo list is full ({MAX_ITEMS} items)")
    item = Item(n=max((i.n for i in todo.items), default=0) + 1, text=text, added_at=now)
    save(path, TodoList(items=(*todo.items, item)))
    return item


def render(todo: TodoList) -> str:
    if not todo.items:
        return "The todo list is empty."
    return "\n".join(f"{i.n}. {i.text}" for i in todo.items)


async def add(args: dict[str, Any], ctx: HasWorkspace) -> str:
    try:
        parsed = AddArguments.model_validate(args)
    except ValidationError as exc:
        fields = json.dumps(exc.errors(include_url=False, include_context=False), default=str)
        raise ValueError(f"invalid arguments: {fields}") from None
    item = await asyncio.to_thread(added, ctx.workspace, parsed.text, datetime.now(UTC))
    return f"Added item {item.n}: {item.text}"


async def list_items(_: dict[str, Any], ctx: HasWorkspace) -> str:
    return render(await asyncio.to_thread(load, todo_path(ctx.workspace)))
