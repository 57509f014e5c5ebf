"""Handing an activation's directories to its sandbox never goes through a symbolic link.

The docker backend (`_own`) and the kubernetes backend with `host_paths` (`_hand_over`) chown
or chmod the workspace and the session's directory, which a sandbox of the same session may be
writing at that very moment: a file or directory it swaps for a link to one of the
orchestrator's own files (the secret key, say) must not hand that file over. A check of the
path and then a chmod/chown by path (which follows links) left that window open.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from suzumio.orchestrator.backends.docker import _own
from suzumio.orchestrator.backends.docker_settings import Owner
from suzumio.orchestrator.backends.kubernetes import _hand_over

SANDBOX_UID = 54_321
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")

# Swaps, as fast as it can, files for links to `outside_file` and directories for links to
# `outside_dir` (and back), the way a hostile sandbox of the same session could.
SWAPPER = r"""
import os, sys
root, outside_file, outside_dir, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
while True:
    for k in range(n):
        f, t = os.path.join(root, f"f{k}"), os.path.join(root, f".t{k}")
        fd = os.open(t, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
        os.close(fd)
        os.chmod(t, 0o400)
        os.replace(t, f)
        os.symlink(outside_file, t)
        os.replace(t, f)
        d, aside = os.path.join(root, f"d{k}"), os.path.join(root, f".d{k}")
        try:
            os.rename(d, aside)
            os.symlink(outside_dir, d)
            os.unlink(d)
            os.rename(aside, d)
        except OSError:
            pass
"""

Give = Callable[[Path], None]


def docker_private(root: Path) -> None:  # not root: the sandbox runs as us, files kept private
    _own(root, Owner(os.geteuid(), os.getegid(), chown=False))


def docker_chown(root: Path) -> None:
    _own(root, Owner(SANDBOX_UID, SANDBOX_UID, chown=True))


def kubernetes_as_root(root: Path) -> None:
    _hand_over(root, SANDBOX_UID, SANDBOX_UID)


def kubernetes_not_root(root: Path) -> None:  # geteuid patched by the test: opened to all
    _hand_over(root, SANDBOX_UID, SANDBOX_UID)


GIVERS = [
    pytest.param(docker_private, False, id="docker-private"),
    pytest.param(docker_chown, True, id="docker-chown", marks=root_only),
    pytest.param(kubernetes_as_root, True, id="kubernetes-chown", marks=root_only),
    pytest.param(kubernetes_not_root, False, id="kubernetes-open-to-all"),
]


def outside(tmp_path: Path) -> tuple[Path, Path, Path]:
    """One of the orchestrator's files, and one of its directories with a file in it."""
    secret = tmp_path / "outside" / "secret.key"
    secret.parent.mkdir()
    secret.write_text("ours")
    secret.chmod(0o400)
    directory = tmp_path / "outside" / "dir"
    directory.mkdir(mode=0o700)
    (directory / "inner").write_text("ours too")
    (directory / "inner").chmod(0o400)
    return secret, directory, directory / "inner"


def fingerprint(*paths: Path) -> list[tuple[int, int, int]]:
    return [(p.lstat().st_uid, p.lstat().st_gid, stat.S_IMODE(p.lstat().st_mode)) for p in paths]


@pytest.fixture
def not_root(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.callspec.id == "kubernetes-open-to-all":
        monkeypatch.setattr(os, "geteuid", lambda: 1_000)  # an orchestrator that is not root


@pytest.mark.usefixtures("not_root")
@pytest.mark.parametrize(("give", "chowns"), GIVERS)
def test_links_in_the_tree_are_not_followed(tmp_path: Path, give: Give, chowns: bool) -> None:
    secret, directory, inner = outside(tmp_path)
    root = tmp_path / "workspace"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "mine.txt").write_text("the sandbox's")
    (root / "sub" / "mine.txt").chmod(0o400)
    (root / "secret-link").symlink_to(secret)
    (root / "sub" / "dir-link").symlink_to(directory)
    before = fingerprint(secret, directory, inner)

    give(root)

    assert fingerprint(secret, directory, inner) == before
    mine = (root / "sub" / "mine.txt").lstat()
    if chowns:
        assert (mine.st_uid, mine.st_gid) == (SANDBOX_UID, SANDBOX_UID)
    else:
        assert stat.S_IMODE(mine.st_mode) & 0o600 == 0o600  # the owner may write it now


@pytest.mark.usefixtures("not_root")
@pytest.mark.parametrize(("give", "chowns"), GIVERS)
def test_entries_swapped_for_links_while_the_walk_runs_are_not_followed(
    tmp_path: Path, give: Give, chowns: bool
) -> None:
    """A sandbox of the same session swapping files and directories for links to ours while
    the orchestrator walks its tree (a race: tried for a few seconds, or until it is lost)."""
    secret, directory, inner = outside(tmp_path)
    root = tmp_path / "session"
    root.mkdir()
    entries = 20
    for k in range(entries):
        (root / f"d{k}").mkdir()
        (root / f"d{k}" / "inner").write_text("the sandbox's")
    before = fingerprint(secret, directory, inner)
    swapper = subprocess.Popen(  # noqa: S603 - our own script
        [sys.executable, "-c", SWAPPER, str(root), str(secret), str(directory), str(entries)]
    )
    try:
        deadline = time.monotonic() + 4
        walks, aborted = 0, 0
        while time.monotonic() < deadline:
            try:
                give(root)
            except FileNotFoundError:  # an entry gone between its listing and its check
                aborted += 1
            walks += 1
            assert fingerprint(secret, directory, inner) == before, f"after {walks} walks"
    finally:
        swapper.kill()
        swapper.wait()
    assert walks > 10
    # The sandbox's own churn does not fail the handing over (the launch) either.
    assert aborted == 0, f"{aborted} of {walks} walks failed"
