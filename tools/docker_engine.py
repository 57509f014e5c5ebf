"""Make sure a Docker engine answers (`python3 tools/docker_engine.py`).

The docker backend's tests talk to a real engine (DESIGN.md §13). On a machine without one,
when we are root and apt-get exists, this installs `docker.io` (and `debootstrap`, which
`tools/runner_image.py` uses to make a base image offline) and starts `dockerd` in the
background without a bridge or iptables rules (containers then use the host's network), with
its log in `.suzumio/dockerd.log`. The daemon is left running for whoever comes next. As root
it also installs `bubblewrap`, with which the process backend isolates its runners (its tests
check that isolation).

Runs under any python3 (dev.py calls it before the venv matters), so standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATE = ROOT / ".suzumio"
# Machine-wide, not per clone: every checkout on this machine shares the one engine.
LOCK = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "suzumio" / "engine.lock"
DOCKERD_ARGS = ("--bridge=none", "--iptables=false", "--ip6tables=false")
PACKAGES = ("docker.io", "debootstrap", "bubblewrap")
START_TIMEOUT = 60.0


def engine_answers(timeout: float = 10.0) -> bool:
    """Whether `docker info` reaches a server."""
    if shutil.which("docker") is None:
        return False
    try:
        done = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0 and bool(done.stdout.strip())


def _say(message: str) -> None:
    print(f"docker engine: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    """One installer/starter at a time (several test runs may ask at once)."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _missing() -> list[str]:
    wanted = {
        "docker.io": ("dockerd", "docker"),
        "debootstrap": ("debootstrap",),
        "bubblewrap": ("bwrap",),
    }
    return [pkg for pkg, tools in wanted.items() if any(shutil.which(t) is None for t in tools)]


def _apt_install(packages: list[str]) -> bool:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    _say(f"installing {' '.join(packages)} with apt-get ...")
    if subprocess.run(cmd, env=env, capture_output=True, check=False).returncode == 0:
        return True
    # A fresh machine may have no package lists yet.
    subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=False)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        _say(f"apt-get install failed:\n{done.stderr.strip()[-2000:]}")
    return done.returncode == 0


def _daemon_alive() -> bool:
    """A dockerd already started (maybe still starting up) owns its pid file."""
    try:
        pid = int(Path("/var/run/docker.pid").read_text().strip())
        return Path(f"/proc/{pid}/comm").read_text().strip() == "dockerd"
    except (OSError, ValueError):
        return False


def _start_dockerd() -> int:
    STATE.mkdir(parents=True, exist_ok=True)
    log = (STATE / "dockerd.log").open("ab")
    proc = subprocess.Popen(
        ["dockerd", *DOCKERD_ARGS],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # outlives us: it is the machine's engine from now on
    )
    log.close()
    return proc.pid


def _wait(timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if engine_answers(timeout=5.0):
            return True
        time.sleep(0.5)
    return False


def _install_and_start(install: bool) -> bool:
    missing = _missing()
    if missing and (not install or not _apt_install(missing)):
        return False
    if engine_answers():  # it did already: only tools were missing
        return True
    if shutil.which("dockerd") is None:
        _say("dockerd is not installed")
        return False
    if not _daemon_alive():
        pid = _start_dockerd()
        _say(f"started dockerd (pid {pid}, log {STATE / 'dockerd.log'})")
    if _wait(START_TIMEOUT):
        return True
    _say(f"dockerd did not answer within {START_TIMEOUT:.0f} s; see {STATE / 'dockerd.log'}")
    return False


def ensure_engine(install: bool = True) -> bool:
    """Make a Docker engine answer (and the tools above be installed) if this machine allows
    it; return whether an engine answers."""
    can_install = os.geteuid() == 0 and shutil.which("apt-get") is not None
    if engine_answers() and not (install and can_install and _missing()):
        return True
    if not can_install:
        if engine_answers():
            return True
        _say("none answers, and only root with apt-get can install and start one here")
        return False
    with _lock():
        return _install_and_start(install)


def main() -> int:
    ok = ensure_engine()
    _say("ready" if ok else "unavailable")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
