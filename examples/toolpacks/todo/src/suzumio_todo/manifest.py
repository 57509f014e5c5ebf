"""The todo toolpack's manifest: what the platform reads without importing any handler."""

from __future__ import annotations

from suzumio.contracts.runner import ToolDefinition
from suzumio.contracts.toolpacks import ToolpackManifest, WebEntry

NAME = "todo"
REMINDER_KIND = "todo.reminder"
"""The `kind` in the payload of the custom signals this toolpack records."""

ADD = ToolDefinition(
    name="todo.add",
    description="Add an item to this session's todo list. Returns the item with its number.",
    parameters={
        "type": "object",
        "properties": {
            "text": {"type": "string", "minLength": 1, "maxLength": 500},
        },
        "required": ["text"],
        "additionalProperties": False,
    },
)
LIST = ToolDefinition(
    name="todo.list",
    description="List this session's todo items, oldest first.",
    parameters={"type": "object", "properties": {}, "additionalProperties": False},
    read_only=True,
)

MANIFEST = ToolpackManifest(
    name=NAME,
    version="0.1.0",
    description="A todo list kept in the session's workspace, with reminders.",
    tools=(ADD, LIST),
    runner_handlers={
        ADD.name: "suzumio_todo.tools:add",
        LIST.name: "suzumio_todo.tools:list_items",
    },
    support_operations={"todo.remind": "suzumio_todo.support:remind"},
    web_entries=(
        WebEntry(
            id="todo",
            title="Todo list",
            description="What the todo toolpack does and how an agent uses it.",
            path="index.html",
        ),
    ),
    scheduler_hooks=("suzumio_todo.hooks:remind_when_idle",),
)
