"""The rules a grant and a launch are held to before any sandbox exists: a grant stays the
directory it was when granted, and none reaches the platform's own directories (at grant time
in the session service, again when planned in the orchestrator); who a docker sandbox runs as
and what mode its files get; which network it joins (DESIGN.md §8, §10)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from suzumio.contracts.errors import ForbiddenError, InvalidError
from suzumio.contracts.values import NetworkProfile, WorkspaceMode
from suzumio.orchestrator import planning
from suzumio.orchestrator.backends.base import MountPlan
from suzumio.orchestrator.backends.docker import DockerBackend
from suzumio.orchestrator.backends.docker_settings import (
    DockerSettings,
    Networks,
    Owner,
    choose_networks,
    private_mode,
    sandbox_owner,
)
from suzumio.orchestrator.directory import Grant
from suzumio.orchestrator.planning import PlanError, Planner, checked_mounts
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.session.mounts import canonical_mount_path
from suzumio.session.settings import SessionSettings
from tests.integration.test_docker_backend import make_plan


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = (tmp_path / "roots").resolve()
    (root / "shared" / "inner").mkdir(parents=True)
    (root / "elsewhere" / "inner").mkdir(parents=True)
    (root / "elsewhere" / "inner" / "secret.txt").write_text("not granted")
    return root


def grant(path: Path, *, writable: bool = False) -> Grant:
    host_path = canonical_mount_path(str(path), [path.parent.parent])
    return Grant(host_path, "/data", writable=writable, agent_id=None)


def stored(path: Path, target: str = "/data") -> Grant:
    """A grant as the log holds it, however it got there."""
    return Grant(str(path), target, writable=False, agent_id=None)


# -- a grant re-checked when planned ------------------------------------------------------------
def test_a_grant_that_is_still_what_was_granted_is_mounted(tree: Path) -> None:
    inner = tree / "shared" / "inner"
    mounts = checked_mounts([grant(inner, writable=True)], ())
    assert mounts == (MountPlan(inner, "/data", writable=True),)


async def test_the_planner_resolves_grants_off_the_event_loop(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grant's host path on a stalled network filesystem would hold the orchestrator's
    loop — every watch, cancel and its leader lock — for as long as it is resolved: it is
    resolved in a worker thread."""
    on_loop: list[bool] = []
    realpath = os.path.realpath

    def noting(path: Any, **kw: Any) -> str:
        on_loop.append(threading.current_thread() is threading.main_thread())
        return str(realpath(path, **kw))

    settings = OrchestratorSettings(work_dir=tmp_path / "sandboxes", data_dir=tmp_path / "data")
    planner = Planner(cast("Any", None), cast("Any", None), None, settings)
    inner = tree / "shared" / "inner"
    agent = SimpleNamespace(id="a1", workspace_mode=WorkspaceMode.MOUNT)
    project = SimpleNamespace(grants={"g": grant(inner)})
    monkeypatch.setattr(os.path, "realpath", noting)  # the module planning resolves with
    mounts = await planner._mounts(cast("Any", agent), cast("Any", project))
    assert mounts == (MountPlan(inner, "/data", writable=False),)
    assert on_loop
    assert not any(on_loop)


async def test_a_grant_whose_file_system_stalls_fails_the_plan_and_holds_no_more_threads(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grant on a stalled network filesystem: its plan fails after the check's time,
    saying why, rather than waiting for ever; while checks are stuck, further plans with
    grants are refused at once instead of piling up threads; once the file system answers,
    plans go through again."""
    stalled = threading.Event()
    realpath = os.path.realpath

    def stalling(path: Any, **kw: Any) -> str:
        if "shared" in str(path):
            stalled.wait(30)
        return str(realpath(path, **kw))

    settings = OrchestratorSettings(work_dir=tmp_path / "sandboxes", data_dir=tmp_path / "data")
    planner = Planner(cast("Any", None), cast("Any", None), None, settings)
    agent = cast("Any", SimpleNamespace(id="a1", workspace_mode=WorkspaceMode.MOUNT))
    project = cast("Any", SimpleNamespace(grants={"g": grant(tree / "shared" / "inner")}))
    monkeypatch.setattr(planning, "MOUNT_CHECK_SECONDS", 0.2)
    monkeypatch.setattr(planning, "_mount_checks", threading.BoundedSemaphore(1))
    monkeypatch.setattr(os.path, "realpath", stalling)  # the module planning resolves with
    try:
        with pytest.raises(PlanError, match="did not answer"):
            await planner._mounts(agent, project)
        with pytest.raises(PlanError, match="not answering"):
            await planner._mounts(agent, project)
    finally:
        stalled.set()
    for _ in range(200):  # the stuck check ends, and gives its place back
        with contextlib.suppress(PlanError):
            assert await planner._mounts(agent, project)
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the grant was never mounted once its file system answered")


@pytest.mark.parametrize("swapped", ["inner", "shared"])
def test_a_link_planted_in_a_granted_path_is_refused(tree: Path, swapped: str) -> None:
    """An agent with `roots/` writable can replace the granted directory (or one above it)
    by a link; the bind would then follow it."""
    granted = grant(tree / "shared" / "inner")
    victim = tree / "shared" / "inner" if swapped == "inner" else tree / "shared"
    shutil.rmtree(victim)
    victim.symlink_to("/etc" if swapped == "inner" else tree / "elsewhere")
    with pytest.raises(PlanError, match=r"now resolves to \S+ \(a link in its path"):
        checked_mounts([granted], ())


def test_a_grant_whose_directory_is_gone_is_refused(tree: Path) -> None:
    granted = grant(tree / "shared" / "inner")
    (tree / "shared" / "inner").rmdir()
    (tree / "shared" / "inner").write_text("a file now")
    with pytest.raises(PlanError, match="no longer an existing directory"):
        checked_mounts([granted], ())


@pytest.mark.parametrize("where", ["is", "contains", "inside"])
def test_a_grant_overlapping_the_platforms_directories_is_refused_when_planned(
    tree: Path, where: str
) -> None:
    data = tree / "shared" / "inner"
    granted = {"is": data, "contains": tree / "shared", "inside": data / "sandboxes"}[where]
    granted.mkdir(exist_ok=True)
    with pytest.raises(PlanError, match="overlaps the platform's own directory"):
        checked_mounts([stored(granted)], (data,))
    assert checked_mounts([stored(tree / "elsewhere")], (data,))


# -- a grant refused at grant time --------------------------------------------------------------
@pytest.mark.parametrize("where", ["data", "above", "inside", "sandboxes", "link"])
def test_a_grant_of_the_platforms_directories_is_refused(tmp_path: Path, where: str) -> None:
    home = tmp_path.resolve()
    data, work = home / "data", home / "work"
    for d in (data / "nats", work / "activations", home / "mounts"):
        d.mkdir(parents=True)
    (home / "mounts" / "link").symlink_to(data)
    settings = SessionSettings(data_dir=data, work_dir=work, mount_roots=str(home))
    path = {
        "data": data,
        "above": home,
        "inside": data / "nats",
        "sandboxes": work / "activations",
        "link": home / "mounts" / "link",
    }[where]
    with pytest.raises(ForbiddenError, match="platform's own data or sandboxes directory"):
        canonical_mount_path(str(path), settings.allowed_mount_roots(), settings.reserved_dirs())
    fine = canonical_mount_path(
        str(home / "mounts"), settings.allowed_mount_roots(), settings.reserved_dirs()
    )
    assert fine == str(home / "mounts")


def test_the_session_service_knows_the_sandboxes_without_a_work_dir(tmp_path: Path) -> None:
    settings = SessionSettings(data_dir=tmp_path)
    assert settings.reserved_dirs() == (tmp_path, tmp_path / "sandboxes")
    with pytest.raises(InvalidError):
        canonical_mount_path("relative", [tmp_path], settings.reserved_dirs())


# -- docker: who a sandbox runs as, and its files' modes ---------------------------------------
def test_a_root_orchestrator_hands_the_files_to_the_configured_user() -> None:
    owner = sandbox_owner("65534:65534", 0, 0)
    assert owner == Owner(65534, 65534, chown=True)
    assert owner.user == "65534:65534"


def test_a_non_root_orchestrator_runs_its_sandboxes_as_itself() -> None:
    owner = sandbox_owner("65534:65534", 10001, 10002)
    assert owner == Owner(10001, 10002, chown=False)
    assert owner.user == "10001:10002"


@pytest.mark.parametrize(
    ("mode", "is_dir", "private"),
    [(0o777, True, 0o755), (0o700, True, 0o700), (0o666, False, 0o644), (0o400, False, 0o600)],
)
def test_files_stay_writable_by_their_owner_only(mode: int, is_dir: bool, private: int) -> None:
    assert private_mode(mode, is_dir) == private


def test_a_non_root_orchestrator_keeps_the_token_private(tmp_path: Path) -> None:
    """The launch's file preparation as an orchestrator that is not root does it: the input
    with the token readable by its owner only, nothing writable by anyone else."""
    plan = make_plan(tmp_path)
    (plan.host_dir / "workspace" / "in").mkdir(parents=True)
    (plan.host_dir / "workspace" / "in" / "brief.md").write_text("x")
    (plan.host_dir / "workspace" / "in").chmod(0o777)  # what an older version left
    backend = DockerBackend(DockerSettings())
    backend._owner = Owner(os.geteuid() or 10001, os.getegid() or 10001, chown=False)
    backend._prepare(plan, "host")
    assert (plan.host_dir / "input.json").stat().st_mode & 0o777 == 0o600
    for path in (plan.host_dir / "workspace", plan.session_dir):
        for base, dirs, files in os.walk(path):
            for name in ("", *dirs, *files):
                mode = Path(base, name).stat().st_mode
                assert mode & 0o022 == 0, (Path(base, name), oct(mode))


# -- docker: the network of a profile (the engine's own list: tests/integration) ---------------
def test_the_engines_bridge_is_the_default_network() -> None:
    engine_with_bridge = {"bridge", "host", "none"}
    assert choose_networks(DockerSettings(), engine_with_bridge) == Networks("bridge", "bridge")
    assert choose_networks(DockerSettings(), {"host", "none"}) == Networks(
        "host", "host", host_fallback=True
    )
    explicit = DockerSettings(network_mode_egress="suzumio-net", network_mode_full="host")
    for found in (engine_with_bridge, {"host", "none"}):
        assert choose_networks(explicit, found) == Networks("suzumio-net", "host")
    assert choose_networks(DockerSettings(network_mode_egress="host"), engine_with_bridge) == (
        Networks("host", "host")
    )
    only_full = DockerSettings(network_mode_full="suzumio-net")
    assert choose_networks(only_full, engine_with_bridge) == Networks("bridge", "suzumio-net")
    networks = Networks("bridge", "suzumio-net")
    assert networks.of(NetworkProfile.EGRESS) == "bridge"
    assert networks.of(NetworkProfile.FULL) == "suzumio-net"
    assert networks.of(NetworkProfile.NONE) == "none"
