"""Settings of the docker backend, and what they and a plan decide before the engine is asked:
the network mode of a profile, which mounts are allowed, the broker's URL on a bridge, who the
sandbox runs as."""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field

from suzumio.contracts.values import NetworkProfile
from suzumio.orchestrator.backends.base import (
    RESERVED_TARGETS,
    CleanupPolicy,
    LaunchError,
    LaunchPlan,
)

SANDBOX_TMP = "/tmp"  # noqa: S108 - the sandbox's own tmpfs, not ours
BRIDGE = "bridge"  # the engine's default bridge network
HOST = "host"
NOBODY = "65534:65534"
HOST_FALLBACK = (
    "the engine has no bridge network: sandboxes of egress/full profiles share the host's "
    "network and reach every service listening on its loopback (set "
    "SUZUMIO_DOCKER__NETWORK_MODE_EGRESS to a network of the engine to isolate them)"
)
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def _default_base_url() -> str:
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


class DockerSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str = Field(default_factory=_default_base_url, description="the engine's API")
    image: str = Field(default="suzumio-runner:latest", description="for profiles without one")
    user: str = Field(
        default=NOBODY,
        # never root (uid or gid 0): sandboxes always run as a non-root user (DESIGN.md §10)
        pattern=r"^0*[1-9]\d*:0*[1-9]\d*$",
        description="uid:gid (neither 0), when the orchestrator is root; else its own uid:gid",
    )
    cleanup: CleanupPolicy = "always"
    network_mode_egress: str | None = Field(
        default=None,
        description="a network of the engine; default: its bridge, or the host's network only "
        "when it has no bridge",
    )
    network_mode_full: str | None = Field(default=None, description="default: as for egress")
    stop_grace_seconds: int = Field(default=5, ge=0, le=300, description="SIGTERM → SIGKILL")
    tmp_mb: int = Field(default=256, ge=1, description="size of the /tmp tmpfs (≤ disk_mb)")
    init: bool = Field(default=True, description="the engine's init as pid 1 (reaps, forwards)")
    pull_missing: bool = Field(default=True, description="pull an image the engine lacks")
    pull_timeout_seconds: float = Field(
        default=600.0,
        gt=0,
        description="a launch waits this long for its image's pull (a retryable failure past it)",
    )
    api_timeout_seconds: float = Field(default=60.0, gt=0)
    lost_after_seconds: float = Field(
        default=120.0, gt=0, description="a watch gives up on an unreachable engine after this"
    )
    max_threads: int = Field(default=32, ge=2, le=512)
    max_waits: int = Field(
        default=512,
        ge=1,
        le=4_096,
        description="containers waited on at once (a thread and a connection each), apart "
        "from the threads of every other call: launches and stops never queue behind them",
    )


def _is_reserved(target: str) -> bool:
    return target == "/" or any(
        target == r or target.startswith(f"{r}/") for r in (*RESERVED_TARGETS, SANDBOX_TMP)
    )


def check_mounts(plan: LaunchPlan) -> None:
    """Targets must be clean and not reserved; sources must still be the directories that were
    granted. The planner checked the sources too; this runs again right before the bind, since a
    link planted in a source's path in between would have the engine mount its target instead."""
    for mount in plan.mounts:
        target = mount.target
        if not target.startswith("/") or posixpath.normpath(target) != target:
            raise LaunchError(
                f"mount target {target!r} is not a clean absolute path", retryable=False
            )
        if _is_reserved(target):
            raise LaunchError(f"mount target {target!r} is reserved", retryable=False)
        if not mount.host_path.exists():
            raise LaunchError(f"mount source {mount.host_path} does not exist", retryable=False)
        real = os.path.realpath(mount.host_path)
        if real != str(mount.host_path):
            raise LaunchError(
                f"mount source {mount.host_path} now resolves to {real} (a link in its path): "
                "not what was granted",
                retryable=False,
            )


@dataclass(frozen=True)
class Networks:
    """The engine networks sandboxes of the `egress` and `full` profiles join."""

    egress: str
    full: str
    host_fallback: bool = False
    """On the host's network only because the engine has no bridge and none was configured."""

    def of(self, profile: NetworkProfile) -> str:
        if profile is NetworkProfile.NONE:
            return "none"
        return self.full if profile is NetworkProfile.FULL else self.egress


def choose_networks(settings: DockerSettings, engine_networks: Collection[str]) -> Networks:
    """The configured networks, else the engine's bridge (DESIGN.md §8). The host's network
    only when the engine has no bridge: a sandbox there reaches everything on the host's
    loopback (embedded Postgres and NATS included), so it is the last resort, never the default
    on an engine that could isolate."""
    default = BRIDGE if BRIDGE in engine_networks else HOST
    egress = settings.network_mode_egress or default
    return Networks(
        egress=egress,
        full=settings.network_mode_full or egress,
        host_fallback=settings.network_mode_egress is None and default == HOST,
    )


@dataclass(frozen=True)
class Owner:
    """Who a sandbox runs as, and so who must own its input, workspace and session files."""

    uid: int
    gid: int
    chown: bool
    """We are root and hand the files to the sandbox's user; else the sandbox runs as us."""

    @property
    def user(self) -> str:
        return f"{self.uid}:{self.gid}"


def sandbox_owner(configured: str, euid: int, egid: int) -> Owner:
    """The configured user when the orchestrator is root; else the orchestrator's own user. One
    that is not root cannot give files to another user, and opening them to all instead would
    let every local user read the token in input.json and write into the workspaces."""
    if euid == 0:
        uid, gid = configured.split(":")
        return Owner(int(uid), int(gid), chown=True)
    return Owner(euid, egid, chown=False)


def private_mode(mode: int, is_dir: bool) -> int:
    """A mode that lets the owner (the sandbox's user) read and write, and nobody else write."""
    return (mode | (0o700 if is_dir else 0o600)) & ~0o022


# An entry is looked at through a descriptor opened without following a link, so the sandbox
# (which may run while we walk: another activation of the session) cannot swap a file for a
# link to one of ours between a check and a chmod/chown. On Linux, O_PATH opens anything (no
# read permission needed, nothing happens to a FIFO) and /proc/self/fd/N is that very inode
# (Linux has no lchmod); elsewhere the file is opened for reading and fchmod/fchown'd.
_BY_PROC = hasattr(os, "O_PATH") and Path("/proc/self/fd").is_dir()
_ENTRY_FLAGS = (
    os.O_NOFOLLOW
    | os.O_CLOEXEC
    | (os.O_PATH if _BY_PROC else os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# A link met by O_NOFOLLOW (ELOOP; EMLINK on some BSDs), an entry removed meanwhile, a socket.
_SKIPPED = frozenset({errno.ELOOP, errno.EMLINK, errno.ENOENT, errno.ENOTDIR, errno.ENXIO})


def give_tree(
    root: Path, owner: tuple[int, int] | None, mode_of: Callable[[int, bool], int]
) -> None:
    """Give `root` and everything under it to `owner` (uid, gid), or with no owner set each
    one's permission bits to `mode_of(bits, is_dir)`. Never through a symbolic link: links are
    skipped, and a directory or file swapped for one while we walk is skipped too."""
    if not _give(str(root), None, owner, mode_of):
        return
    stack: list[tuple[int, Iterator[str]]] = []
    try:
        if (top := _open_dir(str(root), None)) is None:
            return
        stack.append((top, _names(top)))
        while stack:
            fd, names = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(stack.pop()[0])
            elif _give(name, fd, owner, mode_of) and (child := _open_dir(name, fd)) is not None:
                stack.append((child, _names(child)))
    finally:
        for fd, _ in stack:
            os.close(fd)


def _names(fd: int) -> Iterator[str]:
    with os.scandir(fd) as entries:
        return iter([entry.name for entry in entries])


def _open_dir(name: str, dir_fd: int | None) -> int | None:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _SKIPPED:
            return None
        raise


def _give(
    name: str,
    dir_fd: int | None,
    owner: tuple[int, int] | None,
    mode_of: Callable[[int, bool], int],
) -> bool:
    """Fix one entry; True when it is a directory (to walk into)."""
    try:
        fd = os.open(name, _ENTRY_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _SKIPPED:
            return False
        raise
    try:
        st = os.fstat(fd)
        if stat.S_ISLNK(st.st_mode):  # O_PATH | O_NOFOLLOW opens the link itself
            return False
        target: int | str = f"/proc/self/fd/{fd}" if _BY_PROC else fd
        is_dir = stat.S_ISDIR(st.st_mode)
        if owner is not None:
            if (st.st_uid, st.st_gid) != owner:
                os.chown(target, *owner)
        elif (mode := mode_of(stat.S_IMODE(st.st_mode), is_dir)) != stat.S_IMODE(st.st_mode):
            os.chmod(target, mode)  # noqa: PTH101 - a descriptor, or its /proc path
        return is_dir
    finally:
        os.close(fd)


def via_gateway(url: str) -> str:
    """A loopback URL as a sandbox on a bridge reaches it: through the host gateway."""
    parts = urlsplit(url)
    if parts.hostname not in _LOOPBACK:
        return url
    netloc = "host.docker.internal" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
