"""The repository's rooms (DESIGN.md §3): members, namespaces and who may import whom."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("gateway", "session", "scheduler", "orchestrator", "toolbroker", "cli")
MEMBERS = {
    **{f"libs/{m}": m for m in ("contracts", "platform", "testing")},
    **{f"services/{s}": s for s in SERVICES},
    "runner": "runner",
}


def imported_packages(package_dir: Path) -> set[str]:
    found: set[str] = set()
    for path in package_dir.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
    return {name for name in found if name.startswith("suzumio.")}


def member_of(module: str) -> str:
    return module.split(".")[1]


@pytest.mark.parametrize(("folder", "member"), sorted(MEMBERS.items()))
def test_member_has_its_pyproject_and_namespace_package(folder: str, member: str) -> None:
    pyproject = tomllib.loads((ROOT / folder / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == f"suzumio-{member}"
    assert (ROOT / folder / "src" / "suzumio" / member / "__init__.py").exists()
    assert not (ROOT / folder / "src" / "suzumio" / "__init__.py").exists()


# One exception, a mechanism and not service logic: the process backend starts the runner on
# its own host and holds it to the profile's limits exactly as a pool worker holds its runners
# (cgroups or rlimits). That code (stdlib and the contracts only) lives once, beside the
# sandbox program, whose image must stay small (it may depend on the contracts alone).
SANDBOX_MECHANISMS = {"orchestrator": {"suzumio.runner.limits"}}


@pytest.mark.parametrize("service", SERVICES)
def test_services_import_only_contracts_platform_and_themselves(service: str) -> None:
    imports = imported_packages(ROOT / "services" / service / "src" / "suzumio" / service)
    foreign = {m for m in imports if member_of(m) not in {"contracts", "platform", service}}
    foreign -= SANDBOX_MECHANISMS.get(service, set())
    assert not foreign, f"{service} imports other rooms: {sorted(foreign)}"


def test_the_runner_s_limits_stay_a_mechanism_of_the_stdlib_and_contracts() -> None:
    path = ROOT / "runner" / "src" / "suzumio" / "runner" / "limits.py"
    tree = ast.parse(path.read_text())
    suzumio = {
        node.module for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("suzumio.")
    }  # fmt: skip
    assert {member_of(m) for m in suzumio} <= {"contracts"}


def test_runner_depends_on_contracts_alone() -> None:
    imports = imported_packages(ROOT / "runner" / "src" / "suzumio" / "runner")
    assert {member_of(m) for m in imports} <= {"contracts", "runner"}
    deps = tomllib.loads((ROOT / "runner" / "pyproject.toml").read_text())["project"]
    assert [d for d in deps["dependencies"] if d.startswith("suzumio-")] == ["suzumio-contracts"]


def test_contracts_do_no_io() -> None:
    imports = imported_packages(ROOT / "libs" / "contracts" / "src" / "suzumio" / "contracts")
    assert {member_of(m) for m in imports} == {"contracts"}
    for path in (ROOT / "libs" / "contracts" / "src").rglob("*.py"):
        tree = ast.parse(path.read_text())
        modules = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in (
                node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")]
            )
        }
        assert not modules & {"nats", "asyncpg", "socket", "subprocess", "httpx", "requests"}, path


def test_libs_hold_no_service_code() -> None:
    for lib in ("contracts", "platform"):
        imports = imported_packages(ROOT / "libs" / lib / "src" / "suzumio" / lib)
        assert {member_of(m) for m in imports} <= {"contracts", "platform"}, lib


def test_no_committed_file_names_a_download_address() -> None:
    text = (ROOT / "constraints.txt").read_text()
    assert "://" not in text
    assert all("==" in line for line in text.splitlines() if line and not line.startswith("#"))
