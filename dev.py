#!/usr/bin/env python3
"""The project's verbs, needing nothing but Python 3.11+: `python3 dev.py <verb> [args]`.

    up     start the whole platform (embedded NATS and Postgres unless URLs are set)
    test   run the tests (unit, integration, e2e, fault) against real servers
    bench  measure the performance figures and print them as JSON
    lint   ruff and mypy
    proto  regenerate proto/ from the contracts
    images make sure a Docker engine answers and build the runner image (also before `test`)
    install / install-dev   only create .venv and install

Each verb first makes sure `.venv` exists and holds what it needs (re-installing when a
pyproject.toml, constraints.txt or requirements-dev.txt changed). The Makefile calls this.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
# Beside .venv, not in it: creating a venv anew empties its directory.
INSTALL_LOCK = ROOT / ".suzumio" / "install.lock"
MEMBERS = (
    "libs/contracts", "libs/platform", "libs/testing", "runner",
    "services/gateway", "services/session", "services/scheduler",
    "services/orchestrator", "services/toolbroker", "services/cli",
)  # fmt: skip
EXAMPLES = ("examples/toolpacks/todo",)  # installed too, so the tests can load them
EXTRAS = {"runner": "[aiohttp]"}  # the pool worker's kept clients
SOURCES = [f"{m}/src" for m in (*MEMBERS, *EXAMPLES)]


def _python() -> Path:
    return VENV / "bin" / "python"


def _fingerprint(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _pip(*args: str) -> None:
    env = {**os.environ, "PIP_CONSTRAINT": str(ROOT / "constraints.txt")}
    cmd = [str(_python()), "-m", "pip", "--disable-pip-version-check", "-q", "install", *args]
    subprocess.run(cmd, check=True, env=env)


def _venv_usable() -> bool:
    """Whether .venv's python runs and has pip. A `venv` killed half-way (Ctrl-C while pip is
    bootstrapped) leaves a python without pip, and a python3 upgraded under it a dangling link:
    either would fail every later run the same way."""
    try:
        done = subprocess.run(
            [str(_python()), "-c", "import pip"], capture_output=True, check=False
        )
    except OSError:
        return False
    return done.returncode == 0


def _create_venv() -> None:
    print(f"{'repairing' if VENV.exists() else 'creating'} {VENV} ...", flush=True)
    package = f"python3.{sys.version_info.minor}-venv"
    # Debian and Ubuntu ship ensurepip in a package of their own, and their venv then exits
    # the process itself: ask first, and get it as root.
    if importlib.util.find_spec("ensurepip") is None and not _install_venv_module(package):
        sys.exit(
            f"this python3 has no ensurepip, so {VENV} cannot have pip: install it "
            f"(as root: apt-get install {package}) and run this again."
        )
    try:
        venv.create(VENV, clear=True, with_pip=True)  # clear: also drops the stamps below
    except (OSError, subprocess.CalledProcessError) as exc:
        sys.exit(f"could not create {VENV} with pip ({exc}); fix that and run this again.")


def _install_venv_module(package: str) -> bool:
    """apt-get install `package` (python3.X-venv: ensurepip), if we may."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return False
    print(f"installing {package} with apt-get (this python3 has no ensurepip) ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "-q", package]
    if subprocess.run(cmd, env=env, capture_output=True, check=False).returncode == 0:
        return True
    # A fresh machine may have no package lists yet.
    subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=False)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"apt-get install {package} failed:\n{done.stderr.strip()[-2000:]}", flush=True)
    return done.returncode == 0


@contextlib.contextmanager
def _install_lock() -> Iterator[None]:
    """One installer at a time: two commands started together (`up` and `test`, two `test`s)
    would otherwise create the venv or run pip over each other's files."""
    INSTALL_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with INSTALL_LOCK.open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("waiting for another dev.py command installing into .venv ...", flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def install(dev: bool = False) -> None:
    if sys.version_info < (3, 11):
        sys.exit(f"Suzumio needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    with _install_lock():
        _install(dev)


def _install(dev: bool) -> None:
    if not _venv_usable():
        _create_venv()
    packages = (*MEMBERS, *EXAMPLES)
    runtime = [ROOT / "constraints.txt", *(ROOT / m / "pyproject.toml" for m in packages)]
    editable = [a for m in packages for a in ("-e", f"{ROOT / m}{EXTRAS.get(m, '')}")]
    steps = [("runtime", runtime, editable)]
    if dev:
        steps.append(("dev", [ROOT / "requirements-dev.txt", *runtime],
                      ["-r", str(ROOT / "requirements-dev.txt")]))  # fmt: skip
    for name, inputs, args in steps:
        stamp = VENV / f".installed-{name}"
        fingerprint = _fingerprint(inputs)
        if stamp.exists() and stamp.read_text() == fingerprint:
            continue
        print(f"installing {name} dependencies into {VENV} ...", flush=True)
        _pip(*args)
        stamp.write_text(fingerprint)


INTERRUPT_GRACE_SECONDS = 2.0  # after a Ctrl-C, before it is passed on to the command


def run(*cmd: str) -> int:
    """Run `cmd` to its end, its exit code. A Ctrl-C lets it end on its own: typed in the
    terminal it reached the command too, and pytest's teardown stops what the tests started
    (containers, servers) — subprocess.run killed it after 0.25 s. Passed on after a moment
    when it did not reach it (a SIGINT sent to this process alone); the next kills it."""
    process = subprocess.Popen(cmd, cwd=ROOT)
    interrupted = heard = False
    while True:
        try:
            if interrupted and not heard:
                try:
                    return process.wait(INTERRUPT_GRACE_SECONDS)
                except subprocess.TimeoutExpired:
                    process.send_signal(signal.SIGINT)
                    heard = True
            return process.wait()
        except KeyboardInterrupt:
            if interrupted:
                process.kill()
            interrupted = True
            heard = heard or _in_the_foreground(process.pid)


def _in_the_foreground(pid: int) -> bool:
    """Whether `pid` is in the terminal's foreground process group: a Ctrl-C typed there
    reached it as well (passed on too, a second one would cut pytest's teardown short)."""
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgid(pid)
    except OSError:  # no terminal, or the process is gone
        return False


def images() -> int:
    """The docker backend's tests need an engine and the runner image: get both if we can."""
    if run(sys.executable, "tools/docker_engine.py") != 0:
        print("no Docker engine here: the docker backend's tests will fail", file=sys.stderr)
        return 1
    if run(sys.executable, "tools/runner_image.py") != 0:
        print("no runner image: the docker backend's tests will fail", file=sys.stderr)
        return 1
    return 0


def _parallel(args: list[str]) -> list[str]:
    """pytest-xdist's workers (`SUZUMIO_TEST_WORKERS`, default 2; 0 or 1: none), unless the
    arguments choose. Much of a test's time is spent waiting on servers and subprocesses: two
    workers on two cores took the suite from 34 to 18 minutes. Each worker starts its own NATS
    and Postgres; a test module stays on one worker (`loadfile`), with its module-scoped
    fixtures."""
    chosen = any(
        a == "-n" or (a.startswith("-n") and not a.startswith("--"))
        or a.startswith(("--numprocesses", "--dist")) or a in {"no:xdist", "-pno:xdist"}
        for a in args
    )  # fmt: skip
    raw = os.environ.get("SUZUMIO_TEST_WORKERS", "2")
    try:
        workers = int(raw)
    except ValueError:
        print(f"SUZUMIO_TEST_WORKERS={raw!r} is not a number; running without workers",
              file=sys.stderr)  # fmt: skip
        workers = 0
    if chosen or workers <= 1:
        return []
    return ["-n", str(workers), "--dist", "loadfile"]


def test(python: str, args: list[str]) -> int:
    images()  # without them the docker tests fail with a clear error; the rest still run
    code = run(python, "-m", "pytest", "-m", "not bench", *_parallel(args), *args)
    if code == 5:  # pytest's "no tests collected" is a failure, never a success
        print("no tests were collected", file=sys.stderr)
        return 1
    return code


def _setup(verb: str) -> bool:
    """The install `verb` needs; False (having said what to do) when pip failed."""
    try:
        if verb in {"up", "install"}:
            install()
        if verb in {"test", "bench", "lint", "proto", "install-dev", "images"}:
            install(dev=True)
    except subprocess.CalledProcessError as exc:
        # pip said why above; nothing was marked installed, so running again resumes.
        print(
            f"pip install failed (exit {exc.returncode}; its error is above). Fix that (the "
            "network, a proxy, PIP_INDEX_URL) and run the same command again.",
            file=sys.stderr,
        )
        return False
    return True


def main(argv: list[str]) -> int:
    verb, args = (argv[0], argv[1:]) if argv else ("help", [])
    python = str(_python())
    if not _setup(verb):
        return 1
    if verb == "install":
        return 0
    if verb == "up":
        os.execv(str(VENV / "bin" / "suzumio"), ["suzumio", "up", *args])
    if verb == "images":
        return images()
    if verb == "test":
        return test(python, args)
    if verb == "bench":
        return run(python, "-m", "tests.bench", *args)
    if verb == "lint":
        return (
            run(python, "-m", "ruff", "check", ".")
            or run(python, "-m", "ruff", "format", "--check", ".")
            or run(python, "-m", "mypy", *SOURCES, "tools", "tests", "dev.py")
        )
    if verb == "proto":
        return run(python, "tools/gen_proto.py")
    if verb == "install-dev":
        return 0
    print(__doc__)
    return 0 if verb == "help" else 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:  # between commands: no traceback
        sys.exit(130)
