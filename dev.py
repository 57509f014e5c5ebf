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

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
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


def install(dev: bool = False) -> None:
    if sys.version_info < (3, 11):
        sys.exit(f"Suzumio needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    if not _python().exists():
        print(f"creating {VENV} ...", flush=True)
        venv.create(VENV, with_pip=True)
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


def run(*cmd: str) -> int:
    return subprocess.run(cmd, cwd=ROOT, check=False).returncode


def images() -> int:
    """The docker backend's tests need an engine and the runner image: get both if we can."""
    if run(sys.executable, "tools/docker_engine.py") != 0:
        print("no Docker engine here: the docker backend's tests will fail", file=sys.stderr)
        return 1
    if run(sys.executable, "tools/runner_image.py") != 0:
        print("no runner image: the docker backend's tests will fail", file=sys.stderr)
        return 1
    return 0


def test(python: str, args: list[str]) -> int:
    images()  # without them the docker tests fail with a clear error; the rest still run
    code = run(python, "-m", "pytest", "-m", "not bench", *args)
    if code == 5:  # pytest's "no tests collected" is a failure, never a success
        print("no tests were collected", file=sys.stderr)
        return 1
    return code


def main(argv: list[str]) -> int:
    verb, args = (argv[0], argv[1:]) if argv else ("help", [])
    python = str(_python())
    if verb in {"up", "install"}:
        install()
        if verb == "install":
            return 0
        os.execv(str(VENV / "bin" / "suzumio"), ["suzumio", "up", *args])
    if verb in {"test", "bench", "lint", "proto", "install-dev", "images"}:
        install(dev=True)
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
    sys.exit(main(sys.argv[1:]))
