"""Child processes that die with their parent and can be stopped in order."""

from __future__ import annotations

import ctypes
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

_PR_SET_PDEATHSIG = 1
_libc: ctypes.CDLL | None
try:
    _libc = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - not Linux
    _libc = None


def child_setup(death_signal: int) -> Callable[[], None]:
    """A `preexec_fn`: own process group, and `death_signal` when the parent thread dies.

    The own group keeps a terminal's Ctrl-C away from children, so the parent stops them in
    order (services first, servers last); the death signal means a parent killed with SIGKILL
    still leaves no orphans. Start children from the main thread: the signal fires when the
    *thread* that forked them exits.
    """

    def setup() -> None:
        os.setpgid(0, 0)
        if _libc is not None:
            _libc.prctl(_PR_SET_PDEATHSIG, death_signal, 0, 0, 0)

    return setup


def spawn(
    argv: Sequence[str],
    *,
    log: IO[bytes] | int | None,
    stop_signal: int,
    env: dict[str, str] | None = None,
    user: str | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT if log is not None else None,
        env=env,
        user=user,
        cwd=cwd,
        preexec_fn=child_setup(stop_signal),  # noqa: PLW1509 - prctl needs it; main thread
    )


def stop_process(process: subprocess.Popen[bytes], stop_signal: int, timeout: float) -> int:
    """Ask politely with `stop_signal`, then SIGKILL after `timeout` seconds; the exit code."""
    if process.poll() is None:
        try:
            process.send_signal(stop_signal)
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
        except ProcessLookupError:
            pass
    return process.wait()


_handed_out: set[tuple[str, int]] = set()
FIRST_DRAWN = 10_000  # above the ports services commonly listen on
LAST_PORT = 65_535


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago and that this process has not handed out before,
    for a server that binds it later (often in another process).

    It is drawn below the kernel's ephemeral range, as `free_port_run` does: a port from the
    kernel (`bind(0)`) is an ephemeral one, and in the moment before the server binds it, any
    process's outgoing connection may take it as its local port (seen in CI: the tool-broker of
    a `suzumio up` got "Address already in use" on its `--broker-port`). Someone may still
    take the port before it is bound: callers retry then."""
    return free_port_run(1, host)


def free_port_run(count: int, host: str = "127.0.0.1") -> int:
    """The first of `count` consecutive TCP ports that were free a moment ago, for a caller
    that is given one port and counts on from it (`suzumio up --internal-ports-from`).

    The run is taken outside the kernel's ephemeral range (below it, else above it): a run
    within it could be free when probed and then be the local port of anyone's outgoing
    connection before it is bound (seen in CI as "port ... is in use" for the fourth port of
    a run from `bind(0)`). A host whose range leaves no room on either side gets a run from
    the whole range of unprivileged ports."""
    low, high = _ephemeral_range()
    if low - count > FIRST_DRAWN:
        span = (FIRST_DRAWN, low - count)
    elif high + 1 < LAST_PORT - count:
        span = (high + 1, LAST_PORT - count)
    else:
        span = (FIRST_DRAWN, LAST_PORT - count)
    for _ in range(1000):
        first = random.randrange(*span)
        run = [(host, port) for port in range(first, first + count)]
        if any(taken in _handed_out for taken in run) or not all(map(_bindable, run)):
            continue
        _handed_out.update(run)
        return first
    raise OSError(f"no run of {count} free ports on {host} in {span[0]}-{span[1]}")


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return 32_768, 60_999  # Linux's default


def _bindable(address: tuple[str, int]) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(address)
        except OSError:
            return False
    return True


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_until(predicate: Callable[[], bool], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.01
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.2)


@dataclass
class RunningServer:
    """A server this process started (and stops), or one found running and only borrowed."""

    name: str
    url: str
    pid: int
    process: subprocess.Popen[bytes] | None = None
    stop_signal: int = signal.SIGTERM
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def owned(self) -> bool:
        return self.process is not None

    def alive(self) -> bool:
        """Whether it still runs (ours: not exited, and reaped if it did; borrowed: its pid)."""
        if self.process is not None:
            return self.process.poll() is None
        return pid_alive(self.pid)

    def stop(self, timeout: float = 15.0) -> None:
        if self.process is not None:
            stop_process(self.process, self.stop_signal, timeout)
