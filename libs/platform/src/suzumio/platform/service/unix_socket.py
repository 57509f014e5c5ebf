"""A Unix socket a service serves HTTP on besides its port: the tool-broker's, which docker
sandboxes without any network (network profile `none`) reach it through, mounted in.

The socket is made afresh at each start: a file left by a process that died is removed, but
one another live process still answers on is not taken over (the start fails and says so).
Its mode lets any user of the host connect — a sandbox's user is not the service's — so what
keeps strangers out is what keeps them out of the port: the runner API takes an activation's
token on every call. The directory it is in is made (0755) if missing.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

# sun_path is 108 bytes on Linux, its last one the terminating NUL.
MAX_PATH_BYTES = 107


class SocketPathError(RuntimeError):
    """The socket cannot be made where it was asked for."""


@dataclass(frozen=True)
class UnixListener:
    sock: socket.socket
    path: Path
    made: tuple[int, int]
    """The file the bind made (inode and change time: an inode number alone may be reused by a
    newer process's socket at the same path, which must not be removed)."""

    def remove(self) -> None:
        """Remove the socket's file if it is still this one's."""
        with contextlib.suppress(OSError):
            if _identity(self.path) == self.made:
                self.path.unlink()


def _identity(path: Path) -> tuple[int, int]:
    found = path.lstat()
    return found.st_ino, found.st_ctime_ns


def bind_unix(path: Path) -> UnixListener:
    """A stream socket bound at `path` (absolute), mode 0666, ready to listen."""
    if not path.is_absolute():
        raise SocketPathError(f"the Unix socket {path} must be an absolute path")
    if len(os.fsencode(path)) > MAX_PATH_BYTES:
        raise SocketPathError(
            f"the Unix socket path {path} is longer than {MAX_PATH_BYTES} bytes, the most a "
            "socket's address holds: choose a shorter one"
        )
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    _remove_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        # Any user: a sandbox's is not the service's (the token is what lets a caller in).
        path.chmod(0o666)
        made = _identity(path)
    except OSError:
        sock.close()
        raise
    return UnixListener(sock, path, made)


def _remove_stale(path: Path) -> None:
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketPathError(f"{path} exists and is not a socket: not replacing it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except OSError:  # nobody answers: what a process that died left
        path.unlink(missing_ok=True)
        return
    finally:
        probe.close()
    raise SocketPathError(f"another process is serving on {path}")
