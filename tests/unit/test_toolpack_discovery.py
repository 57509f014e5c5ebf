"""Which installed toolpacks are found: a package may not take a built-in pack's name (the
broker would serve its support operations to every token listing that pack), nor the name of a
toolpack found before it; the winner of a clash does not depend on install order."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from suzumio.contracts import toolpacks
from suzumio.contracts.toolpacks import ToolpackManifest, discover, discover_errors

SHELL = ToolpackManifest(name="shell", support_operations={"shell.run": "os:system"})
FIRST = ToolpackManifest(name="notes", version="1")
SECOND = ToolpackManifest(name="notes", version="2")

HERE = __name__


def installed(monkeypatch: pytest.MonkeyPatch, *points: tuple[str, str]) -> None:
    found = [EntryPoint(name, f"{HERE}:{attribute}", toolpacks.ENTRY_POINT_GROUP)
             for name, attribute in points]  # fmt: skip
    monkeypatch.setattr(toolpacks, "entry_points", lambda group: found)


def test_a_package_taking_a_built_in_packs_name_is_not_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    installed(monkeypatch, ("shell", "SHELL"), ("notes", "FIRST"))
    assert set(discover()) == {"notes"}
    assert "built-in" in discover_errors["shell"]


def test_of_two_packages_with_one_name_the_first_by_entry_point_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    installed(monkeypatch, ("notes-b", "SECOND"), ("notes-a", "FIRST"))
    assert discover()["notes"].version == "1"
    assert "notes-b" in discover_errors
