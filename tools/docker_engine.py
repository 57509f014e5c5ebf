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
PIDFILE = Path("/var/run/docker.pid")  # dockerd's default
PACKAGES = ("docker.io", "debootstrap", "bubblewrap")
START_TIMEOUT = 60.0
APT_LOCK_TIMEOUT = 300


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
    # Wait for dpkg's lock (a fresh machine's unattended-upgrades holds it) instead of failing.
    lock_wait = ("-o", f"DPkg::Lock::Timeout={APT_LOCK_TIMEOUT}")
    cmd = ["apt-get", *lock_wait, "install", "-y", "-q", "--no-install-recommends", *packages]
    _say(f"installing {' '.join(packages)} with apt-get ...")
    if subprocess.run(cmd, env=env, capture_output=True, check=False).returncode == 0:
        return True
    # A fresh machine may have no package lists yet.
    subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=False)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        _say(f"apt-get install failed:\n{done.stderr.strip()[-2000:]}")
        _say(f"install by hand: apt-get install -y {' '.join(packages)}")
    return done.returncode == 0


def _daemon_alive() -> bool:
    """A dockerd already started (maybe still starting up) owns its pid file."""
    try:
        pid = int(PIDFILE.read_text().strip())
        return Path(f"/proc/{pid}/comm").read_text().strip() == "dockerd"
    except (OSError, ValueError):
        return False


def _start_dockerd() -> subprocess.Popen[bytes]:
    # A dockerd killed without cleaning up leaves its pid file; dockerd refuses to start while
    # the pid in it is alive, and after a restart (a container's small pids) it often names
    # some other live process. Not a dockerd's (we checked, under the lock): stale.
    if PIDFILE.exists():
        _say(f"removing the stale {PIDFILE} of a dockerd that is gone")
        PIDFILE.unlink(missing_ok=True)
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
    return proc


def _log_tail(lines: int = 15) -> str:
    try:
        text = (STATE / "dockerd.log").read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _wait(timeout: float, proc: subprocess.Popen[bytes] | None = None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if engine_answers(timeout=5.0):
            return True
        if proc is not None and proc.poll() is not None:  # it gave up: say why, now
            _say(f"dockerd exited with code {proc.returncode}:\n{_log_tail()}")
            return False
        time.sleep(0.5)
    return False


def _install_and_start(install: bool) -> bool:
    missing = _missing()
    if missing and install:
        # Failing to install a tool (apt-get offline or locked) must not cost an engine that
        # answers or a dockerd already installed: carry on, the tool's users say it is missing.
        _apt_install(missing)
    if engine_answers():  # it did already: only tools were missing
        return True
    if shutil.which("dockerd") is None:
        _say("dockerd is not installed (apt-get install -y docker.io)")
        return False
    proc = None
    if not _daemon_alive():
        proc = _start_dockerd()
        _say(f"started dockerd (pid {proc.pid}, log {STATE / 'dockerd.log'})")
    if _wait(START_TIMEOUT, proc):
        return True
    if proc is not None and proc.returncode is not None:
        return False
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
