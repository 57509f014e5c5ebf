"""What a pool worker removes of a workspace (a run's directory, a warm session's at its TTL):
all of it, though an agent made directories read-only, as `go build` does to its module
cache — without following a link. As an unprivileged user (root could remove it anyway): when
the tests run as root, the tree is made and removed in a child that became `nobody`."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from suzumio.runner.workfiles import remove_tree

NOBODY = 65534


@contextlib.contextmanager
def unprivileged_dir() -> Iterator[Path]:
    """A directory `nobody` may write (under the temporary directory, not pytest's: its
    parents are root's alone)."""
    base = Path(tempfile.mkdtemp(prefix="remove-tree-"))
    if os.geteuid() == 0:
        os.chown(base, NOBODY, NOBODY)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def as_unprivileged(work: Callable[[], bool]) -> bool:
    pid = os.fork()
    if pid == 0:  # the child: drop root if it is root, work, and leave without cleanup
        ok = False
        try:
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            ok = work()
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def test_a_read_only_tree_is_removed_and_no_link_followed() -> None:
    with unprivileged_dir() as base:
        outside = base / "outside"  # what a planted link points to: left as it is

        def make_and_remove() -> bool:
            outside.mkdir(mode=0o755)
            tree = base / "workspace"
            cache = tree / "go/pkg/mod/example.com/m@v1"
            cache.mkdir(parents=True)
            (cache / "go.mod").write_text("module m")
            sealed = tree / "sealed/inner"
            sealed.mkdir(parents=True)
            (sealed / "f").write_text("x")
            (tree / "link").symlink_to(outside)
            for directory in (cache, cache.parent, tree / "go"):
                directory.chmod(0o555)
            (tree / "sealed").chmod(0o000)
            remove_tree(tree)
            return not tree.exists()

        assert as_unprivileged(make_and_remove)
        assert oct(outside.stat().st_mode & 0o777) == "0o755"
