"""The file tools the model calls: `file.read`, `file.write`, `file.patch`, `file.search`.

Every path goes through `paths.resolve`, so the tools see only the workspace and the granted
mounts. The work is blocking file I/O, so it runs in a worker thread: parallel reads of one
segment do not stall the loop's event loop. Writes go through `paths.atomic_write` (temporary
file in the same directory, fsync, rename): a reader or a crash sees the old or the new content,
never half of it.
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Protocol

import regex  # type: ignore[import-untyped]

from suzumio.contracts.runner import ToolDefinition
from suzumio.runner.tools.base import ToolContext, ToolInputError, ToolResult, printable
from suzumio.runner.tools.paths import (
    Reads,
    Target,
    Writes,
    atomic_write,
    check_keys,
    fingerprint,
    named_paths,
    object_schema,
    open_regular,
    optional_int,
    optional_str,
    required_str,
    resolve,
    shown,
)

_SNIFF_BYTES = 8192
_PIECE = 64 * 1024
_MAX_EDITS = 100

_PATH_PROP = {
    "type": "string",
    "description": "Relative to the workspace, or absolute inside the workspace or a mount.",
}


async def in_thread(work: Callable[[], ToolResult]) -> ToolResult:
    """Run blocking tool work off the event loop; bad input and OS errors become results the
    model reads instead of exceptions the loop has to interpret."""
    try:
        return await asyncio.to_thread(work)
    except ToolInputError as exc:
        return ToolResult(str(exc), "error")
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        return ToolResult(f"{where}{exc.strerror or exc}", "error")


def is_binary(head: bytes) -> bool:
    return b"\x00" in head[:_SNIFF_BYTES]


class FileRead(Reads):
    definition = ToolDefinition(
        name="file.read",
        description=(
            "Read a text file with line numbers (like `cat -n`), or list a directory. Use "
            "offset (first line, 1-based) and limit (number of lines) to page through large "
            "files; long output ends with a '[truncated: N more bytes]' note telling where to "
            "continue. Binary files are reported by size only."
        ),
        parameters=object_schema(
            {
                "path": _PATH_PROP,
                "offset": {"type": "integer", "minimum": 1, "description": "First line (1)."},
                "limit": {"type": "integer", "minimum": 1, "description": "Lines to return."},
            },
            required=("path",),
        ),
        read_only=True,
    )
    _keys = frozenset({"path", "offset", "limit"})

    def paths(self, args: dict[str, Any], ctx: ToolContext) -> tuple[Path, ...]:
        # The file (or directory) read: a write of it earlier in the same response must finish
        # first, or the read returns the old or the new content by chance.
        return named_paths(args.get("path"), ctx)

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await in_thread(lambda: self._read(args, ctx))

    def _read(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        check_keys(args, self._keys)
        target = resolve(args.get("path"), ctx)
        offset = optional_int(args, "offset") or 1
        limit = optional_int(args, "limit")
        cap = ctx.limits.read_max_bytes
        if target.path.is_dir():
            return ToolResult(_listing(target, cap))
        fd, info = open_regular(target)
        with os.fdopen(fd, "rb") as file:
            if is_binary(file.read(_SNIFF_BYTES)):
                return ToolResult(f"{target.shown} is a binary file ({info.st_size} bytes)")
            file.seek(0)
            if info.st_size == 0:
                return ToolResult(f"{target.shown} is empty")
            return ToolResult(_numbered(file, info.st_size, offset, limit, cap, target.shown))


def _listing(target: Target, cap: int) -> str:
    with os.scandir(target.path) as scan:
        entries = sorted(scan, key=lambda e: e.name)
    rows = [f"{target.shown}/ ({len(entries)} entries)"]
    used = len(rows[0])
    for index, entry in enumerate(entries):
        suffix = "@" if entry.is_symlink() else "/" if entry.is_dir(follow_symlinks=False) else ""
        row = printable(entry.name) + suffix  # a name that is not UTF-8 shows \\xNN escapes
        if used + len(row) + 1 > cap:
            rows.append(f"[truncated: {len(entries) - index} more entries]")
            break
        rows.append(row)
        used += len(row) + 1
    return "\n".join(rows)


def _lines(file: IO[bytes], keep: int) -> Iterator[tuple[bytes, int]]:
    """Each line's first `keep` bytes and its full length, never holding a whole long line
    (a minified bundle can be one 50 MB line)."""
    while piece := file.readline(_PIECE):
        head, length = piece[:keep], len(piece)
        while not piece.endswith(b"\n"):
            piece = file.readline(_PIECE)
            if not piece:
                break
            if len(head) < keep:
                head += piece[: keep - len(head)]
            length += len(piece)
        yield head, length


def _numbered(
    file: IO[bytes], size: int, offset: int, limit: int | None, cap: int, shown: str
) -> str:
    out: list[str] = []
    used = consumed = lineno = 0
    for lineno, (head, length) in enumerate(_lines(file, cap + 1), start=1):
        if lineno < offset:
            consumed += length
            continue
        if limit is not None and lineno >= offset + limit:
            return "".join(out) + _more(size - consumed, lineno)
        prefix = f"{lineno:>6}\t"
        row = f"{prefix}{head.decode('utf-8', 'replace').rstrip(chr(13) + chr(10))}\n"
        size_row = len(row.encode())
        if used + size_row > cap:
            if out:
                return "".join(out) + _more(size - consumed, lineno)
            # One line alone exceeds the cap: show its beginning, then move past it.
            cut = row.encode()[: max(cap - 1, len(prefix))].decode("utf-8", "ignore")
            consumed += len(cut.encode()) - len(prefix)
            return f"{cut}\n[line {lineno} cut]" + _more(size - consumed, lineno + 1)
        out.append(row)
        used += size_row
        consumed += length
    if lineno < offset:
        return f"offset {offset} is past the end of {shown} ({lineno} lines)"
    return "".join(out)


def _more(remaining: int, next_line: int) -> str:
    return f"[truncated: {remaining} more bytes] continue with offset={next_line}"


class FileWrite(Writes):
    definition = ToolDefinition(
        name="file.write",
        description=(
            "Create or overwrite a UTF-8 text file with the given content (the whole file). "
            "Missing parent directories are created. The write is atomic. Prefer file.patch "
            "for small changes to an existing file."
        ),
        parameters=object_schema(
            {"path": _PATH_PROP, "content": {"type": "string", "description": "Full content."}},
            required=("path", "content"),
        ),
    )
    _keys = frozenset({"path", "content"})

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await in_thread(lambda: self._write(args, ctx))

    def _write(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        check_keys(args, self._keys)
        target = resolve(args.get("path"), ctx, write=True)
        content = args.get("content")
        if not isinstance(content, str):
            raise ToolInputError("content is required and must be a string")
        data = _encode(content, ctx.limits.write_max_bytes)
        created = atomic_write(target, data)
        verb = "created" if created else "overwrote"
        return ToolResult(f"{verb} {target.shown} ({len(data)} bytes written)")


def _encode(text: str, cap: int) -> bytes:
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolInputError("content is not valid Unicode (lone surrogate)") from None
    if len(data) > cap:
        raise ToolInputError(f"content is {len(data)} bytes; the limit is {cap} bytes")
    return data


class FilePatch(Writes):
    definition = ToolDefinition(
        name="file.patch",
        description=(
            "Edit an existing UTF-8 text file by exact string replacement. Each edit's `old` "
            "must occur exactly once in the file (include enough surrounding lines to make it "
            "unique) unless replace_all is true. Edits apply in order, each to the result of "
            "the previous; if any edit fails, nothing is written."
        ),
        parameters=object_schema(
            {
                "path": _PATH_PROP,
                "edits": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": _MAX_EDITS,
                    "items": object_schema(
                        {
                            "old": {"type": "string", "minLength": 1},
                            "new": {"type": "string"},
                            "replace_all": {"type": "boolean", "default": False},
                        },
                        required=("old", "new"),
                    ),
                },
            },
            required=("path", "edits"),
        ),
    )
    _keys = frozenset({"path", "edits"})

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await in_thread(lambda: self._patch(args, ctx))

    def _patch(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        check_keys(args, self._keys)
        target = resolve(args.get("path"), ctx, write=True)
        edits = _edits(args.get("edits"))
        cap = ctx.limits.write_max_bytes
        fd, info = open_regular(target)
        with os.fdopen(fd, "rb") as file:
            raw = file.read(cap + 1)
        if len(raw) > cap:
            raise ToolInputError(f"{target.shown} is larger than {cap} bytes; cannot patch it")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolInputError(f"{target.shown} is not UTF-8 text; cannot patch it") from None
        text, replaced = _apply(text, edits, target.shown)
        data = _encode(text, cap)
        atomic_write(target, data, expect=fingerprint(info))
        return ToolResult(
            f"patched {target.shown}: {len(edits)} edit(s), {replaced} replacement(s), "
            f"{len(data)} bytes"
        )


Edit = tuple[str, str, bool]


def _edits(value: object) -> list[Edit]:
    if not isinstance(value, list) or not value:
        raise ToolInputError("edits must be a non-empty list of {old, new, replace_all}")
    if len(value) > _MAX_EDITS:
        raise ToolInputError(f"at most {_MAX_EDITS} edits per call")
    edits: list[Edit] = []
    for number, item in enumerate(value, start=1):
        if not isinstance(item, dict):
            raise ToolInputError(f"edit {number} must be an object with old and new")
        check_keys(item, frozenset({"old", "new", "replace_all"}))
        old, new, every = item.get("old"), item.get("new"), item.get("replace_all", False)
        if not isinstance(old, str) or not old:
            raise ToolInputError(f"edit {number}: old must be a non-empty string")
        if not isinstance(new, str):
            raise ToolInputError(f"edit {number}: new must be a string")
        if not isinstance(every, bool | None):
            raise ToolInputError(f"edit {number}: replace_all must be true or false")
        edits.append((old, new, bool(every)))
    return edits


def _apply(text: str, edits: list[Edit], shown: str) -> tuple[str, int]:
    replaced = 0
    for number, (old, new, every) in enumerate(edits, start=1):
        first = text.find(old)
        if first < 0:
            raise ToolInputError(
                f"edit {number}: old text not found in {shown} (after the edits before it); "
                f"nothing was changed. Looked for: {old[:120]!r}"
            )
        if every:
            replaced += text.count(old)
            text = text.replace(old, new)
            continue
        if text.find(old, first + 1) >= 0:
            count = max(text.count(old), 2)
            raise ToolInputError(
                f"edit {number}: old text occurs {count} times in {shown}; add surrounding "
                "lines to make it unique or set replace_all; nothing was changed"
            )
        text = text[:first] + new + text[first + len(old) :]
        replaced += 1
    return text, replaced


class FileSearch(Reads):
    definition = ToolDefinition(
        name="file.search",
        description=(
            "Search file contents with a Python regular expression, line by line. Optional "
            "path (a directory or file; default the workspace) and glob on file names (e.g. "
            "'*.py'; a glob with '/' matches the path below the search directory). Symbolic "
            "links are not followed; binary and very large files are skipped. Output lines "
            "are 'path:line: text'."
        ),
        parameters=object_schema(
            {
                "pattern": {"type": "string", "minLength": 1, "description": "Python regex."},
                "path": _PATH_PROP | {"description": "Directory or file to search (default .)."},
                "glob": {"type": "string", "description": "File-name glob, e.g. '*.py'."},
                "ignore_case": {"type": "boolean", "default": False},
            },
            required=("pattern",),
        ),
        read_only=True,
    )
    _keys = frozenset({"pattern", "path", "glob", "ignore_case"})

    def paths(self, args: dict[str, Any], ctx: ToolContext) -> tuple[Path, ...]:
        # The search's root (the workspace by default): it reads everything below, so any
        # write inside it earlier in the same response must finish first.
        raw = args.get("path")
        return named_paths("." if raw is None or raw == "" else raw, ctx)

    def allowed_seconds(self, args: dict[str, Any], ctx: ToolContext) -> float:
        del args
        return ctx.limits.search_timeout_seconds

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        # A thread cannot be cancelled, so the walk checks this flag between lines; a single
        # match is bounded by the search's deadline instead.
        stop = threading.Event()
        try:
            return await in_thread(lambda: self._search(args, ctx, stop))
        finally:
            stop.set()

    def _search(self, args: dict[str, Any], ctx: ToolContext, stop: threading.Event) -> ToolResult:
        check_keys(args, self._keys)
        pattern = _regex(required_str(args, "pattern"), args.get("ignore_case"))
        start = resolve(optional_str(args, "path") or ".", ctx)
        glob = optional_str(args, "glob") or None
        limits = ctx.limits
        deadline = time.monotonic() + limits.search_timeout_seconds
        found: list[str] = []
        searched = too_large = binary = 0
        for path, size in _walk(start.path):
            if stop.is_set() or len(found) >= limits.search_max_results:
                break
            if time.monotonic() > deadline:
                found.append(
                    f"[search stopped at its {limits.search_timeout_seconds:g}s time limit; "
                    "narrow the path or glob]"
                )
                break
            if glob and not _glob_match(path, start.path, glob):
                continue
            if size > limits.search_max_file_bytes:
                too_large += 1
                continue
            data = _read_quietly(path, limits.search_max_file_bytes)
            if data is None or is_binary(data):
                binary += data is not None
                continue
            searched += 1
            shown_path = shown(path, ctx)
            try:
                for lineno, line in _matches(pattern, data, deadline, stop):
                    found.append(f"{shown_path}:{lineno}: {_clip(line.rstrip(chr(13)))}")
                    if len(found) >= limits.search_max_results:
                        break
            except _TooSlowError as exc:
                return ToolResult(
                    f"the pattern took too long: the search stopped after "
                    f"{limits.search_timeout_seconds:g}s (at {shown_path}:{exc.lineno}). Nested "
                    "repetition such as (a+)+ or (a|aa)+ backtracks exponentially; simplify "
                    "the pattern or narrow the path or glob.",
                    "timeout",
                )
        return ToolResult(_report(found, limits.search_max_results, searched, too_large, binary))


# Version-control internals and caches: matches there are noise, never what the model wants.
_SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__"})
_LINE_CHARS = 300


class _TooSlowError(Exception):
    def __init__(self, lineno: int) -> None:
        super().__init__(f"line {lineno}")
        self.lineno = lineno


def _matches(
    pattern: _Pattern, data: bytes, deadline: float, stop: threading.Event
) -> Iterator[tuple[int, str]]:
    """The matching lines of a file, numbered; raises _TooSlowError at the deadline."""
    for lineno, line in enumerate(data.decode("utf-8", "replace").split("\n"), 1):
        if stop.is_set():
            return
        try:
            # `concurrent` releases the GIL while matching, so the event loop runs on;
            # `timeout` ends a catastrophically backtracking match, which nothing else can.
            hit = pattern.search(
                line, concurrent=True, timeout=max(deadline - time.monotonic(), 0.001)
            )
        except TimeoutError:
            raise _TooSlowError(lineno) from None
        if hit is not None:
            yield lineno, line


class _Pattern(Protocol):
    """What the search uses of a compiled `regex` pattern (the package ships no types)."""

    def search(self, string: str, *, concurrent: bool, timeout: float) -> object | None: ...


def _regex(pattern: str, ignore_case: object) -> _Pattern:
    """The `regex` package in its `re`-compatible mode (VERSION0): unlike `re` it can release
    the GIL and give up after a timeout."""
    if not isinstance(ignore_case, bool | None):
        raise ToolInputError("ignore_case must be true or false")
    try:
        compiled: _Pattern = regex.compile(pattern, regex.V0 | (regex.I if ignore_case else 0))
    except (regex.error, ValueError, OverflowError) as exc:
        raise ToolInputError(f"pattern is not a valid Python regular expression: {exc}") from None
    return compiled


def _walk(start: Path) -> Iterator[tuple[Path, int]]:
    """Regular files under `start` in name order, with sizes; links are never followed, so
    the walk cannot leave the root it started in."""
    if not start.is_dir():
        info = start.lstat()
        if stat.S_ISREG(info.st_mode):
            yield start, info.st_size
        return
    stack = [start]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as scan:
                entries = sorted(scan, key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if entry.name not in _SKIP_DIRS:
                    subdirs.append(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                yield Path(entry.path), entry.stat(follow_symlinks=False).st_size
        stack.extend(reversed(subdirs))


def _glob_match(path: Path, start: Path, glob: str) -> bool:
    if "/" in glob:
        return fnmatch.fnmatchcase(path.relative_to(start).as_posix(), glob)
    return fnmatch.fnmatchcase(path.name, glob)


def _read_quietly(path: Path, cap: int) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None  # vanished, unreadable or swapped for a link since the walk saw it
    with os.fdopen(fd, "rb") as file:
        return file.read(cap + 1)


def _clip(line: str) -> str:
    return line if len(line) <= _LINE_CHARS else line[:_LINE_CHARS] + " [...]"


def _report(found: list[str], cap: int, searched: int, too_large: int, binary: int) -> str:
    lines = list(found) or [f"no matches ({searched} files searched)"]
    if len(found) >= cap:
        lines.append(f"[results capped at {cap}; narrow the pattern, path or glob]")
    if too_large or binary:
        lines.append(f"[skipped {too_large} files over the size limit and {binary} binary files]")
    return "\n".join(lines)
