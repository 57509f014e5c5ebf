"""Toolpacks: named bundles a project enables for its agents (DESIGN.md §1, §7).

A toolpack is described by a manifest, published by an installed package under the entry point
group `suzumio.toolpacks` (the entry point names a `ToolpackManifest` or a function returning
one). Code is named by `module:attribute` strings, so reading a manifest imports nothing: the
runner imports its handlers, the tool-broker its support operations, the scheduler its hooks,
each only where it runs.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from suzumio.contracts.runner import ToolDefinition

ENTRY_POINT_GROUP = "suzumio.toolpacks"
CodeRef = str  # "package.module:attribute"


class WebEntry(BaseModel):
    """A page or panel the web page offers for the toolpack."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    title: str = Field(max_length=200)
    description: str = Field(default="", max_length=2_000)
    path: str = Field(description="URL path under the toolpack's web root", max_length=500)


class ToolpackManifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    version: str = "0"
    description: str = ""
    tools: tuple[ToolDefinition, ...] = Field(default=(), description="model-facing tools")
    runner_handlers: dict[str, CodeRef] = Field(
        default_factory=dict, description="tool name -> the runner-side handler"
    )
    support_operations: dict[str, CodeRef] = Field(
        default_factory=dict,
        description="the controller-side operations the broker may run for it: the allowlist",
    )
    web_entries: tuple[WebEntry, ...] = ()
    scheduler_hooks: tuple[CodeRef, ...] = ()


BUILTIN_PACK_NAMES = frozenset({"core", "files", "shell", "web"})
"""The runner's own packs: no installed package may take their names, or the broker would
serve its support operations to every token that lists the built-in pack."""


def discover() -> dict[str, ToolpackManifest]:
    """The manifests of the installed toolpacks, by name. A broken one is skipped (and the
    error kept in `discover_errors`) so one bad package cannot take every toolpack down; so
    is one that takes a built-in pack's name, or the name of a toolpack found before it
    (entry points in name order: which one wins does not depend on install order)."""
    found: dict[str, ToolpackManifest] = {}
    discover_errors.clear()
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: (e.name, e.value)):
        try:
            value: Any = ep.load()
            manifest = value() if callable(value) else value
            manifest = ToolpackManifest.model_validate(manifest)
        except Exception as exc:
            discover_errors[ep.name] = repr(exc)
            continue
        if manifest.name in BUILTIN_PACK_NAMES or manifest.name in found:
            taken = "a built-in pack's" if manifest.name in BUILTIN_PACK_NAMES else "another's"
            discover_errors[ep.name] = f"the name {manifest.name!r} is {taken}"
            continue
        found[manifest.name] = manifest
    return found


discover_errors: dict[str, str] = {}


def resolve(ref: CodeRef) -> Any:
    """Import `module:attribute`."""
    module, _, attribute = ref.partition(":")
    if not module or not attribute:
        raise ValueError(f"{ref!r} is not of the form module:attribute")
    target: Any = importlib.import_module(module)
    for part in attribute.split("."):
        target = getattr(target, part)
    return target
