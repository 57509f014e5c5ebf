"""A local sandbox's resource limits, from its runtime profile (`ResourceLimits`): for the
process backend's runners and a pool worker's, and all they start (shell commands included).

Where the host lets this process make cgroups — v2 with the memory, pids and cpu controllers,
or v1 with a hierarchy for each (hybrid hosts) — every sandbox gets one of its own, made under
this process's own cgroup (so the host's limits on the service still hold): `memory.max`,
`pids.max` and `cpu.max` (v1: their older names) are the profile's, for the sandbox as a whole.
A v2 cgroup that holds processes cannot hand controllers to children: its processes are moved
into a leaf `suzumio-main` of it first (how a delegated service sets up its subtree).

Elsewhere, rlimits, which are per process and so weaker: `RLIMIT_DATA` at `memory_mb` (the
heap and private writable mappings — unlike `RLIMIT_AS` it does not count the address space
Python, its libraries and its thread arenas reserve and never touch, which would fail a runner
far below its real use), and `RLIMIT_NPROC` at the user's current count plus `pids`
(it counts every process of the user, so only a bound on a runaway; root is exempt from it, so
there is none for a root service). CPU has no per-process rate limit; `RLIMIT_CPU` would be a
total that a long, honest activation reaches, and the wall-clock timeout bounds it anyway:
without a cgroup `cpus` is not enforced. What cannot be enforced is said (`Enforcement`).

`RLIMIT_FSIZE` (`disk_mb`, per file) and no core dumps hold in both cases.

Stdlib and the contracts only: the orchestrator's process backend uses it too (the runner is
installed beside the orchestrator, which starts it), and the runner imports no service.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from suzumio.contracts.values import ResourceLimits

CONTROLLERS = ("memory", "pids", "cpu")
DELEGATED = " ".join(f"+{c}" for c in CONTROLLERS)  # a v2 parent's `cgroup.subtree_control`
CPU_PERIOD_US = 100_000
MAIN_LEAF = "suzumio-main"  # where a v2 cgroup's own processes go
MB = 1024 * 1024
RETRIES = 3  # a tree another owner removes again while this one remakes it: given up then
Mechanism = Literal["cgroup2", "cgroup1", "rlimits"]


@dataclass(frozen=True)
class Enforcement:
    """How the profile's limits are applied on this host, and which are not."""

    mechanism: Mechanism
    unenforced: tuple[str, ...] = ()
    problem: str = ""  # why there is no cgroup

    def detail(self) -> dict[str, object]:
        out: dict[str, object] = {"mechanism": self.mechanism}
        if self.unenforced:
            out["unenforced"] = list(self.unenforced)
        if self.problem:
            out["cgroup_problem"] = self.problem
        return out


@dataclass(frozen=True)
class Sandbox:
    """What a sandbox's first process applies to itself before it runs anything (between fork
    and exec, or in a fork server's child): its cgroup, then its rlimits. Plain data: it goes
    to a fork server as JSON."""

    procs: tuple[str, ...] = ()  # the `cgroup.procs` files to join
    rlimits: tuple[tuple[int, int], ...] = ()

    def apply(self) -> None:
        pid = str(os.getpid()).encode()
        for procs in self.procs:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)
        for which, wanted in self.rlimits:
            _, hard = resource.getrlimit(which)
            # One may lower a hard limit, not raise it.
            value = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
            resource.setrlimit(which, (value, value))

    def to_json(self) -> dict[str, object]:
        return {"procs": list(self.procs), "rlimits": [list(r) for r in self.rlimits]}

    @classmethod
    def from_json(cls, doc: dict[str, object]) -> Sandbox:
        procs = doc.get("procs", [])
        rlimits = doc.get("rlimits", [])
        assert isinstance(procs, list)
        assert isinstance(rlimits, list)
        return cls(tuple(str(p) for p in procs), tuple((int(a), int(b)) for a, b in rlimits))


def rlimits(limits: ResourceLimits, *, contained: bool) -> tuple[tuple[int, int], ...]:
    """The rlimits for a sandbox; `contained`: in a cgroup of its own, which bounds memory and
    processes for the whole sandbox already."""
    out = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, limits.disk_mb * MB)]
    if not contained:
        out.append((resource.RLIMIT_DATA, limits.memory_mb * MB))
        base = user_tasks(os.getuid())
        if base is not None:
            out.append((resource.RLIMIT_NPROC, base + limits.pids))
    return tuple(out)


def user_tasks(uid: int) -> int | None:
    """How many tasks (threads: what `RLIMIT_NPROC` counts) the user has now; None for root,
    whom the kernel never holds to it."""
    if uid == 0:
        return None
    count = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if entry.stat().st_uid == uid:
                count += sum(1 for _ in (entry / "task").iterdir())
    return count


def rlimit_enforcement(problem: str) -> Enforcement:
    unenforced = ("cpus", "pids") if os.getuid() == 0 else ("cpus",)
    return Enforcement("rlimits", unenforced, problem)


@dataclass
class Cgroups:
    """The cgroups of one owner's sandboxes: `<own cgroup>/<name>/<sandbox>` in the unified
    hierarchy (v2), or in each controller's (v1)."""

    version: Literal[1, 2]
    parents: dict[str, Path]  # controller → the owner's directory (v2: the same for all)

    @property
    def enforcement(self) -> Enforcement:
        return Enforcement("cgroup2" if self.version == 2 else "cgroup1")

    def _dirs(self, sandbox: str) -> list[Path]:
        return [p / sandbox for p in dict.fromkeys(self.parents.values())]

    def create(self, sandbox: str, limits: ResourceLimits) -> Sandbox:
        """A sandbox's cgroup with the profile's limits (made again if one was left).

        Raises:
            OSError: the cgroup could not be made.
        """
        _check_name(sandbox)
        self.remove(sandbox)
        quota = max(int(limits.cpus * CPU_PERIOD_US), 1_000)
        memory = str(limits.memory_mb * MB)
        if self.version == 2:
            files = {
                "memory.max": memory,
                "pids.max": str(limits.pids),
                "cpu.max": f"{quota} {CPU_PERIOD_US}",
            }
            writes = {self.parents["memory"] / sandbox: files}
        else:
            writes = {
                self.parents["memory"] / sandbox: {"memory.limit_in_bytes": memory},
                self.parents["pids"] / sandbox: {"pids.max": str(limits.pids)},
                self.parents["cpu"] / sandbox: {
                    "cpu.cfs_period_us": str(CPU_PERIOD_US),
                    "cpu.cfs_quota_us": str(quota),
                },
            }
        # No swap beyond the memory limit where the kernel accounts it (no file otherwise):
        # else a sandbox at its limit went on in swap, as far as the host had any.
        v1_swap = ("memory.memsw.limit_in_bytes", memory)
        no_swap = ("memory.swap.max", "0") if self.version == 2 else v1_swap
        try:
            for directory, values in writes.items():
                self._make(directory)
                for name, value in values.items():
                    (directory / name).write_text(value)
            swap = self.parents["memory"] / sandbox / no_swap[0]
            if swap.exists():  # after the memory limit: v1 wants memsw at least as high
                swap.write_text(no_swap[1])
        except OSError:
            self.remove(sandbox)
            raise
        procs = tuple(str(d / "cgroup.procs") for d in writes)
        return Sandbox(procs, rlimits(limits, contained=True))

    def _make(self, directory: Path) -> None:
        """A sandbox's directory; its owner's made again first when it is gone: another
        replica sharing the tree removed it, empty, as it closed (`release`)."""
        for _ in range(RETRIES):
            try:
                directory.mkdir(exist_ok=True)
            except FileNotFoundError:
                with contextlib.suppress(FileNotFoundError):
                    self._make_owner(directory.parent)
            else:
                return
        directory.mkdir(exist_ok=True)

    def _make_owner(self, parent: Path) -> None:
        parent.mkdir(exist_ok=True)
        if self.version == 2:  # the controllers handed down again, as `discover` did
            (parent / "cgroup.subtree_control").write_text(DELEGATED)

    def remove(self, sandbox: str, *, kill: bool = True, wait: float = 5.0) -> bool:
        """Kill what the sandbox's cgroup still holds (`kill`) and remove it; whether it is
        gone (a cgroup with members stays)."""
        _check_name(sandbox)
        gone = True
        for directory in self._dirs(sandbox):
            if not directory.is_dir():
                continue
            if kill:
                _empty(directory, wait)
            try:
                directory.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                gone = False
        return gone

    def oom_kills(self, sandbox: str) -> int:
        """How many processes of the sandbox the kernel killed for its memory limit (0 when
        unknown: the cgroup gone, or a kernel that does not count them)."""
        _check_name(sandbox)
        directory = self.parents["memory"] / sandbox
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        for line in _read(directory / name).splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    def sandboxes(self) -> list[str]:
        names: set[str] = set()
        for parent in self.parents.values():
            with contextlib.suppress(OSError):
                names.update(p.name for p in parent.iterdir() if p.is_dir())
        return sorted(names)

    def sweep(self, keep: set[str] | None = None) -> None:
        """Remove the empty cgroups of sandboxes that are gone (not in `keep`): left by an
        owner killed before its cleanup. One with members is left alone."""
        for name in self.sandboxes():
            if keep is None or name not in keep:
                self.remove(name, kill=False)

    def sweep_siblings(
        self, prefix: str, alive: Callable[[str], bool], *, wait: float = 5.0
    ) -> None:
        """The trees of other owners named `prefix…` that are no longer `alive` (pool workers
        killed before they removed theirs), emptied and removed. Their runners died with them,
        but not what the runners' commands left running (a command mid-way, a server started
        in the background: init's now) — nobody else would ever end those. A live owner's are
        never touched: one it just made is empty until its runner joins."""
        for parent in dict.fromkeys(self.parents.values()):
            with contextlib.suppress(OSError):
                for other in parent.parent.iterdir():
                    name = other.name
                    if other == parent or not name.startswith(prefix) or alive(name):
                        continue
                    for child in (p for p in other.iterdir() if p.is_dir()):
                        _empty(child, wait)
                        with contextlib.suppress(OSError):
                            child.rmdir()
                    with contextlib.suppress(OSError):
                        other.rmdir()

    def release(self) -> None:
        """Remove the owner's directory if no sandbox's cgroup is left in it (what still runs
        is left to the next owner of the same name). Another owner of the same name makes it
        again at its next sandbox (`create`)."""
        for parent in dict.fromkeys(self.parents.values()):
            with contextlib.suppress(OSError):
                parent.rmdir()

    def close(self) -> None:
        """Remove every sandbox's cgroup (killing what is in it), then the owner's."""
        for name in self.sandboxes():
            self.remove(name)
        for parent in dict.fromkeys(self.parents.values()):
            with contextlib.suppress(OSError):
                parent.rmdir()


def _check_name(name: str) -> None:
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"not a cgroup name: {name!r}")


def _empty(directory: Path, wait: float) -> None:
    """SIGKILL to every member until none is left (v2's `cgroup.kill` where there is one)."""
    deadline = time.monotonic() + wait
    killer = directory / "cgroup.kill"
    while time.monotonic() < deadline:
        try:
            members = [int(p) for p in (directory / "cgroup.procs").read_text().split()]
        except OSError:
            return
        if not members:
            return
        if killer.exists():
            with contextlib.suppress(OSError):
                killer.write_text("1")
        else:
            for pid in members:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


# -- finding the host's cgroups ----------------------------------------------------------------
def discover(name: str, proc: Path = Path("/proc/self")) -> Cgroups | str:
    """This host's cgroups for an owner called `name` (made if missing), or why there are
    none for it to use. `proc`: where this process's `mountinfo` and `cgroup` are read."""
    _check_name(name)
    try:
        mounts = _cgroup_mounts((proc / "mountinfo").read_text())
        own = _own_paths((proc / "cgroup").read_text())
    except OSError as exc:
        return f"cannot read this process's cgroups: {exc}"
    v2 = mounts.get("")
    if v2 is not None and "" in own:
        base = _inside(v2, own[""])
        available = set(_read(base / "cgroup.controllers").split())
        if set(CONTROLLERS) <= available:
            return _setup_v2(base, name)
    v1 = {c: mounts[c] for c in CONTROLLERS if c in mounts and c in own}
    if len(v1) == len(CONTROLLERS):
        parents = {c: _inside(mount, own[c]) / name for c, mount in v1.items()}
        try:
            for parent in parents.values():
                parent.mkdir(exist_ok=True)
        except OSError as exc:
            return f"cannot make cgroups (v1) here: {exc}"
        return Cgroups(1, parents)
    missing = [c for c in CONTROLLERS if c not in mounts]
    return f"no cgroup v2 with {', '.join(CONTROLLERS)} nor v1 for {', '.join(missing)}"


def _setup_v2(base: Path, name: str) -> Cgroups | str:
    """`<base>/<name>` with the controllers handed down to its children. A cgroup with
    processes cannot hand them down: its processes go into a leaf of it first."""
    try:
        try:
            (base / "cgroup.subtree_control").write_text(DELEGATED)
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            leaf = base / MAIN_LEAF
            leaf.mkdir(exist_ok=True)
            for pid in _read(base / "cgroup.procs").split():
                with contextlib.suppress(ProcessLookupError, OSError):
                    (leaf / "cgroup.procs").write_text(pid)
            (base / "cgroup.subtree_control").write_text(DELEGATED)
        parent = base / name
        parent.mkdir(exist_ok=True)
        (parent / "cgroup.subtree_control").write_text(DELEGATED)
    except OSError as exc:
        return f"cannot make cgroups (v2) under {base}: {exc}"
    return Cgroups(2, dict.fromkeys(CONTROLLERS, parent))


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _cgroup_mounts(mountinfo: str) -> dict[str, tuple[Path, str]]:
    """Controller ("" for the unified hierarchy) → (mount point, the cgroup it shows)."""
    found: dict[str, tuple[Path, str]] = {}
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, point = fields[3], Path(fields[4].replace("\\040", " "))
        if tail[0] == "cgroup2":
            found.setdefault("", (point, root))
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                if option in CONTROLLERS:
                    found.setdefault(option, (point, root))
    return found


def _own_paths(proc_cgroup: str) -> dict[str, str]:
    """Controller ("" for v2) → this process's cgroup in its hierarchy."""
    own: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            own[""] = path
        for controller in controllers.split(","):
            if controller in CONTROLLERS:
                own[controller] = path
    return own


def _inside(mount: tuple[Path, str], path: str) -> Path:
    """Where the cgroup `path` is under a mount that shows the cgroup `root`."""
    point, root = mount
    relative = os.path.relpath(path, root) if path.startswith(root) else path
    return (point / relative.lstrip("/")).resolve() if relative != "." else point
