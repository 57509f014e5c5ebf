"""Confinement for the sandbox tools: where a path argument really points, how a file there is
opened and atomically replaced, and typed argument readers whose messages the model can act on
(DESIGN.md §10).

Path rules, checked on the *resolved* path (every symbolic link followed, `..` applied):

- a relative path is taken from the workspace; an absolute one is accepted only when it lies
  inside the workspace or a granted mount;
- NUL bytes are refused, and so is anything whose resolution leaves every root, whether through
  `..`, an absolute path or a symbolic link anywhere along the path (a link in a directory in
  the middle counts as much as the last component);
- a path that does not exist yet resolves through its deepest existing parent, so a new file
  under a linked directory is judged by where the link really points;
- writes are refused inside read-only mounts; the innermost root decides, so a read-only mount
  inside the workspace stays read-only.

Resolution and use are two system calls apart, so the openers below re-check cheaply what a
concurrent rename could change: the last component is opened with `O_NOFOLLOW`, the opened
directory's real location is read back from `/proc/self/fd` where that exists, and writes go
through a directory descriptor (temporary file, fsync, rename), so a link planted at the final
name is replaced rather than written through.

The file tools confine paths; `shell.exec` is not confined by them (it has the whole sandbox,
and the container is its boundary).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suzumio.runner.tools.base import CallKind, ToolContext, ToolInputError, printable

_MAX_PATH_CHARS = 4096


@dataclass(frozen=True)
class Root:
    """A directory the file tools may use, canonical (no links, absolute)."""

    path: Path
    writable: bool


@dataclass(frozen=True)
class Target:
    """A checked path: canonical, and the innermost root that contains it."""

    path: Path
    root: Root
    shown: str
    """The path as the model should read it back (workspace-relative when inside it)."""


def roots(ctx: ToolContext) -> tuple[Root, ...]:
    """The workspace (writable) followed by the granted mounts, all canonical."""
    found = [Root(_canonical(ctx.workspace), writable=True)]
    found.extend(Root(_canonical(m.path), writable=m.writable) for m in ctx.mounts)
    return tuple(found)


def shown(path: Path, ctx: ToolContext) -> str:
    """How a canonical path is reported: relative inside the workspace, absolute elsewhere."""
    workspace = _canonical(ctx.workspace)
    if path == workspace:
        return "."
    if path.is_relative_to(workspace):
        return printable(path.relative_to(workspace).as_posix())
    return printable(path.as_posix())


def resolve(raw: object, ctx: ToolContext, *, write: bool = False, name: str = "path") -> Target:
    """Check a path argument and return where it really points.

    Raises:
        ToolInputError: the path is malformed, leaves the roots, or is read-only for a write.
    """
    text = _path_text(raw, name)
    candidate = Path(text) if Path(text).is_absolute() else Path(ctx.workspace) / text
    real = _canonical(candidate)
    all_roots = roots(ctx)
    containing = [r for r in all_roots if real.is_relative_to(r.path)]
    if not containing:
        raise ToolInputError(_outside_message(text, candidate, real, all_roots))
    root = max(containing, key=lambda r: len(r.path.parts))
    if write and not root.writable:
        raise ToolInputError(
            f"{name} {text!r} is inside the read-only mount {root.path}; write inside the "
            "workspace or a writable mount instead"
        )
    return Target(path=real, root=root, shown=shown(real, ctx))


def written_paths(args: dict[str, Any], ctx: ToolContext) -> tuple[Path, ...]:
    """The canonical path a write call names, or none when the argument is unusable (the call
    will fail without touching anything, so it reserves nothing)."""
    return named_paths(args.get("path"), ctx)


def named_paths(raw: object, ctx: ToolContext) -> tuple[Path, ...]:
    """The canonical path a path argument names, or none when it is unusable (the call will
    fail on it without reading or writing anything, so it cannot conflict with another)."""
    try:
        return (resolve(raw, ctx).path,)
    except (ToolInputError, OSError):
        return ()


def open_dir(target_dir: Path, root: Root) -> int:
    """Open a directory without following a link in its last component and check it still
    lies inside `root`; the caller works relative to the returned descriptor."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(target_dir, flags)
    except NotADirectoryError:
        raise ToolInputError(f"{target_dir} is not a directory") from None
    except OSError as exc:
        raise ToolInputError(f"cannot open directory {target_dir}: {exc.strerror}") from None
    try:
        _check_still_inside(fd, root)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(target: Target) -> tuple[int, os.stat_result]:
    """Open a regular file for reading, refusing links swapped in after resolution, FIFOs and
    devices (opening a FIFO would block the tool forever)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(target.path, flags)
    except FileNotFoundError:
        raise ToolInputError(f"{target.shown} does not exist") from None
    except OSError as exc:
        raise ToolInputError(f"cannot open {target.shown}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        _check_regular(info, target)
        _check_still_inside(fd, target.root)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def fingerprint(info: os.stat_result) -> tuple[int, int, int, int]:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def atomic_write(
    target: Target, data: bytes, expect: tuple[int, int, int, int] | None = None
) -> bool:
    """Replace `target` with `data` atomically; True when the file is new.

    `expect` is the fingerprint of the version the caller read: a file changed in between is
    not overwritten (a patch computed from stale text would undo someone else's change).
    """
    if target.path == target.root.path:
        raise ToolInputError(f"{target.shown} is a directory")
    target.path.parent.mkdir(parents=True, exist_ok=True)
    dir_fd = open_dir(target.path.parent, target.root)
    try:
        name = target.path.name
        try:
            current: os.stat_result | None = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            current = None
        if current is not None and not stat.S_ISREG(current.st_mode):
            kind = "directory" if stat.S_ISDIR(current.st_mode) else "not a regular file"
            raise ToolInputError(f"{target.shown} is a {kind}; nothing was written")
        if expect is not None and (current is None or fingerprint(current) != expect):
            raise ToolInputError(f"{target.shown} changed while being patched; read it again")
        _replace(dir_fd, name, data, None if current is None else stat.S_IMODE(current.st_mode))
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return current is None


def _replace(dir_fd: int, name: str, data: bytes, mode: int | None) -> None:
    temp = f".{name}.{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o666, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if mode is not None:
                os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        # rename replaces a link at `name` instead of writing through it.
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=dir_fd)
        raise


class Reads:
    """Read-only tools: they share a parallel segment with other reads. A read touching no
    workspace path (`web.fetch`) names none and so conflicts with nothing; the file reads
    override `paths` with the canonical path they read, so a write of an overlapping path in
    the same response does not run beside them (the planner keeps the two in call order)."""

    def kind(self, args: dict[str, Any]) -> CallKind:
        del args
        return "read"

    def paths(self, args: dict[str, Any], ctx: ToolContext) -> tuple[Path, ...]:
        del args, ctx
        return ()


class Writes:
    """Writing tools: they reserve the canonical path they name, so two writes of one file
    (or of a file and its directory) never share a segment."""

    def kind(self, args: dict[str, Any]) -> CallKind:
        del args
        return "write"

    def paths(self, args: dict[str, Any], ctx: ToolContext) -> tuple[Path, ...]:
        return written_paths(args, ctx)


def optional_int(args: dict[str, Any], name: str, *, minimum: int = 1) -> int | None:
    value = args.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ToolInputError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ToolInputError(f"{name} must be at least {minimum}, got {value}")
    return value


def optional_number(args: dict[str, Any], name: str) -> float | None:
    value = args.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ToolInputError(f"{name} must be a number, got {value!r}")
    if not value > 0:
        raise ToolInputError(f"{name} must be greater than 0, got {value}")
    return float(value)


def required_str(args: dict[str, Any], name: str, *, allow_empty: bool = False) -> str:
    value = args.get(name)
    if not isinstance(value, str):
        raise ToolInputError(f"{name} is required and must be a string")
    if not value and not allow_empty:
        raise ToolInputError(f"{name} must not be empty")
    return value


def optional_str(args: dict[str, Any], name: str) -> str | None:
    value = args.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ToolInputError(f"{name} must be a string, got {value!r}")
    return value


def object_schema(properties: dict[str, Any], required: tuple[str, ...]) -> dict[str, Any]:
    """A strict JSON Schema object: listed properties only, the required ones named."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


def check_keys(args: dict[str, Any], allowed: frozenset[str]) -> None:
    """Refuse arguments the schema does not define (a misspelt `offest` must not pass silently)."""
    unknown = sorted(set(args) - allowed)
    if unknown:
        raise ToolInputError(
            f"unexpected argument(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )


def _path_text(raw: object, name: str) -> str:
    if not isinstance(raw, str) or not raw:
        raise ToolInputError(f"{name} is required and must be a non-empty string")
    if "\x00" in raw:
        raise ToolInputError(f"{name} contains a NUL byte")
    if len(raw) > _MAX_PATH_CHARS:
        raise ToolInputError(f"{name} is longer than {_MAX_PATH_CHARS} characters")
    try:
        # A JSON `\ud800` escape decodes to a lone surrogate no file name can hold: every
        # system call on it raises UnicodeEncodeError, which is neither bad input nor OSError
        # to the callers (the segment planner among them).
        os.fsencode(raw)
    except UnicodeEncodeError:
        raise ToolInputError(
            f"{name} {printable(raw)!r} holds a character no file name can (a lone surrogate)"
        ) from None
    return raw


def _canonical(path: Path | str) -> Path:
    # realpath(strict=False) follows every existing link and applies `..` only after the links
    # before it are resolved, as the kernel does; missing components are kept as written.
    return Path(os.path.realpath(path))


def _outside_message(text: str, candidate: Path, real: Path, all_roots: tuple[Root, ...]) -> str:
    where = ", ".join(str(r.path) for r in all_roots)
    lexical = Path(os.path.normpath(candidate))
    if any(lexical.is_relative_to(r.path) for r in all_roots):
        reason = f"it resolves through a symbolic link to {real}"
    elif ".." in Path(text).parts:
        reason = "'..' leads out of the workspace"
    else:
        reason = f"it is at {real}"
    return (
        f"path {text!r} is outside the workspace and granted mounts ({where}): {reason}; "
        "use a path relative to the workspace"
    )


def _check_regular(info: os.stat_result, target: Target) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise ToolInputError(f"{target.shown} is not a regular file")


def _check_still_inside(fd: int, root: Root) -> None:
    try:
        actual = Path(f"/proc/self/fd/{fd}").readlink()
    except OSError:
        return  # no /proc (not Linux): the O_NOFOLLOW open is the remaining guard
    if not actual.is_relative_to(root.path):
        raise ToolInputError(f"{actual} moved outside {root.path} while in use; try again")
