"""Build the runner image `suzumio-runner:latest` (`python3 tools/runner_image.py [--base B]`).

1. The wheels of `libs/contracts` and `runner` and of their dependencies (pinned by
   constraints.txt, for CPython 3.11 on Linux) go into a temporary build context.
2. The base: the public `python:3.11-slim` when the engine has it or can pull it; where no
   image registry is reachable, `suzumio-runner-base:bookworm`, a Debian bookworm made with
   debootstrap (its python3 is 3.11) from the Debian mirror and imported into the engine. The
   root filesystem's tarball is cached in ~/.cache/suzumio, the imported image in the engine.
3. `docker build` with `deploy/runner/Dockerfile`, labelled with a hash of everything that
   went in; a later run that finds an image with the same hash does nothing.

Runs under any python3 (dev.py calls it), so standard library only; uses the docker CLI.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "suzumio-runner:latest"
PUBLIC_BASE = "python:3.11-slim"
OFFLINE_BASE = "suzumio-runner-base:bookworm"
PYTHON_VERSION = "3.11"  # of both bases; the binary wheels must match it
DOCKERFILE = ROOT / "deploy" / "runner" / "Dockerfile"
MEMBERS = ("libs/contracts", "runner")
HASH_LABEL = "io.suzumio.content-hash"
STAGE_LABEL = "io.suzumio.stage=runner-build"  # the Dockerfile's build stage
DEBOOTSTRAP_PACKAGES = "python3,python3-venv,ca-certificates,passwd"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "suzumio"
ROOTFS_TAR = CACHE / "runner-base-bookworm.tar"
SKIP = {"__pycache__", ".pytest_cache", ".mypy_cache", "build", "dist"}


class BuildError(RuntimeError):
    pass


def _say(message: str) -> None:
    print(f"runner image: {message}", file=sys.stderr, flush=True)


def _docker(*args: str, check: bool = True, timeout: float | None = None) -> str:
    done = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise BuildError(f"docker {' '.join(args[:2])} failed:\n{done.stderr.strip()[-3000:]}")
    return done.stdout.strip() if done.returncode == 0 else ""


def image_id(name: str) -> str:
    return _docker("image", "inspect", "--format", "{{.Id}}", name, check=False)


def image_exists(name: str) -> bool:
    return bool(image_id(name))


def image_hash(name: str) -> str | None:
    fmt = f'{{{{ index .Config.Labels "{HASH_LABEL}" }}}}'
    found = _docker("image", "inspect", "--format", fmt, name, check=False)
    return found if found and found != "<no value>" else None


def content_hash(base: str) -> str:
    digest = hashlib.sha256(f"base={base}\npython={PYTHON_VERSION}\n".encode())
    files = [DOCKERFILE, ROOT / "constraints.txt"]
    for member in MEMBERS:
        for path in sorted((ROOT / member).rglob("*")):
            parts = set(path.relative_to(ROOT).parts)
            if (
                path.is_file()
                and not parts & SKIP
                and not any(p.endswith(".egg-info") for p in parts)
            ):
                files.append(path)
    for path in files:
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:32]


def _pip(*args: str) -> None:
    venv_python = ROOT / ".venv" / "bin" / "python"
    python = str(venv_python if venv_python.exists() else sys.executable)
    env = {**os.environ, "PIP_CONSTRAINT": str(ROOT / "constraints.txt")}
    cmd = [python, "-m", "pip", "--disable-pip-version-check", "-q", *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BuildError(f"pip {args[0]} failed:\n{done.stderr.strip()[-3000:]}")


def build_wheels(dest: Path) -> None:
    """Our two members, then their dependencies as binary wheels for the image's Python."""
    _pip("wheel", "--no-deps", "-w", str(dest), *(str(ROOT / m) for m in MEMBERS))
    arch = platform.machine()
    platforms = [f"manylinux2014_{arch}"] + [f"manylinux_2_{v}_{arch}" for v in range(17, 37)]
    ours = [str(p) for p in sorted(dest.glob("*.whl"))]
    _pip(
        "download", "-d", str(dest), "--only-binary=:all:", "--implementation", "cp",
        "--python-version", PYTHON_VERSION, *(a for p in platforms for a in ("--platform", p)),
        *ours,
    )  # fmt: skip


def _debootstrap(target: Path) -> None:
    if shutil.which("debootstrap") is None:
        raise BuildError("debootstrap is not installed (apt-get install -y debootstrap)")
    if os.geteuid() != 0:
        raise BuildError("debootstrap needs root")
    mirror = os.environ.get("SUZUMIO_DEBIAN_MIRROR")
    cmd = ["debootstrap", "--variant=minbase", f"--include={DEBOOTSTRAP_PACKAGES}", "bookworm"]
    cmd += [str(target), *([mirror] if mirror else [])]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BuildError(f"debootstrap failed:\n{(done.stdout + done.stderr).strip()[-3000:]}")
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
        shutil.rmtree(target / junk, ignore_errors=True)
        (target / junk).mkdir(parents=True, exist_ok=True)


def offline_base() -> str:
    """`suzumio-runner-base:bookworm`, from the engine, the cached tarball or debootstrap."""
    if image_exists(OFFLINE_BASE):
        return OFFLINE_BASE
    if not ROOTFS_TAR.exists():
        started = time.monotonic()
        _say("making a Debian bookworm base with debootstrap (about a minute) ...")
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="suzumio-rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            _debootstrap(rootfs)
            partial = ROOTFS_TAR.with_suffix(".partial")
            tar = ["tar", "-C", str(rootfs), "-cf", str(partial), "."]
            done = subprocess.run(tar, capture_output=True, text=True, check=False)
            if done.returncode != 0:  # a BuildError, so main says why (disk full?) in one line
                partial.unlink(missing_ok=True)
                raise BuildError(f"tar of the base failed:\n{done.stderr.strip()[-3000:]}")
            partial.replace(ROOTFS_TAR)
        _say(f"debootstrap done in {time.monotonic() - started:.0f} s ({ROOTFS_TAR})")
    _docker("import", "--change", "ENV LANG=C.UTF-8", str(ROOTFS_TAR), OFFLINE_BASE)
    return OFFLINE_BASE


def _pulled(base: str) -> bool:
    try:
        _docker("pull", "--quiet", base, timeout=180)
    except (BuildError, subprocess.TimeoutExpired):
        _say(f"cannot pull {base}")
        return False
    return True


def resolve_base(base: str, offline: bool) -> str:
    """`base` when the engine has it or can pull it; else the offline base, if `base` is one
    that it stands in for (the public default)."""
    if image_exists(base):
        return base
    if base == OFFLINE_BASE:
        return offline_base()
    if not offline and _pulled(base):
        return base
    if base == PUBLIC_BASE:
        _say(f"using {OFFLINE_BASE} (debootstrap) instead of {base}")
        return offline_base()
    raise BuildError(f"base image {base} is neither on the engine nor pullable")


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    """One build at a time on this machine (test runs of several checkouts may ask at once)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "runner-image.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_image(
    base: str = PUBLIC_BASE, *, tag: str = IMAGE, offline: bool = False, force: bool = False
) -> str:
    """Build `tag` unless an image with the same content hash exists; return its name."""
    wanted = content_hash(base)
    if not force and image_hash(tag) == wanted:
        return tag
    with _lock():
        if not force and image_hash(tag) == wanted:
            return tag
        _build(base, tag, wanted, offline=offline)
    return tag


def _build(base: str, tag: str, wanted: str, *, offline: bool) -> None:
    started = time.monotonic()
    resolved = resolve_base(base, offline)
    previous = image_id(tag)
    with tempfile.TemporaryDirectory(prefix="suzumio-runner-image-") as tmp:
        context = Path(tmp)
        build_wheels(context / "wheels")
        shutil.copyfile(DOCKERFILE, context / "Dockerfile")
        _say(f"building {tag} on {resolved} ...")
        _docker(
            "build", "--quiet", "--build-arg", f"BASE={resolved}", "--label",
            f"{HASH_LABEL}={wanted}", "-t", tag, str(context),
        )  # fmt: skip
    # What the build left behind: its build stage and the image it replaced (kept if in use).
    _docker("image", "prune", "--force", "--filter", f"label={STAGE_LABEL}", check=False)
    if previous and previous != image_id(tag):
        _docker("image", "rm", previous, check=False)
    _say(f"built {tag} in {time.monotonic() - started:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=PUBLIC_BASE, help=f"base image (default {PUBLIC_BASE})")
    parser.add_argument("--tag", default=IMAGE)
    parser.add_argument("--offline", action="store_true", help="do not try to pull the base")
    parser.add_argument("--force", action="store_true", help="build even if up to date")
    args = parser.parse_args(argv)
    if shutil.which("docker") is None:
        _say("no docker CLI here (python3 tools/docker_engine.py installs one)")
        return 1
    try:
        name = ensure_image(args.base, tag=args.tag, offline=args.offline, force=args.force)
    except BuildError as exc:
        _say(str(exc))
        return 1
    _say(f"{name} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
