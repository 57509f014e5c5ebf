"""What every sandbox tool is: a definition the model sees, the paths a call writes (for
segmenting a tool round), and `run`.

Tool names are canonical with a dot (`file.read`); the loop maps them to the provider's
function-name alphabet (`file_read`) and back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from suzumio.contracts.runner import ToolDefinition

Status = Literal["ok", "error", "denied", "timeout", "cancelled"]
CallKind = Literal["read", "write", "exclusive"]
"""How a call may share a parallel segment: reads with reads, writes on disjoint paths,
exclusive calls alone (DESIGN.md Appendix A)."""


_SURROGATE = re.compile(r"[\ud800-\udfff]")


def printable(text: str) -> str:
    """`text` made fit for the history, the audit log and JSON: encodable as UTF-8 and free of
    NUL characters.

    Python keeps the bytes of a file name that are not UTF-8 as lone surrogates (U+DC80 to
    U+DCFF, from `os.fsdecode`); they are shown as `\\xNN` escapes, as `ls -b` shows them. Any
    other lone surrogate (a JSON `\\ud800` escape, say) is shown as `\\uXXXX`. A NUL (from
    `find -print0`, or a binary's output) is shown as `\\0`: the log's read models cannot hold
    it, so the tool-broker refuses text that has one."""
    text = text.replace("\x00", "\\0")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub(_escape, text)
    return text


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


class ToolInputError(ValueError):
    """The arguments are wrong (a bad path, a missing field): the model is told, nothing ran."""


@dataclass(frozen=True)
class ToolResult:
    text: str
    status: Status = "ok"

    @property
    def is_error(self) -> bool:
        return self.status != "ok"


@dataclass(frozen=True)
class Mount:
    """A granted directory inside the sandbox (absolute path there)."""

    path: Path
    writable: bool = False


@dataclass(frozen=True)
class ToolLimits:
    read_max_bytes: int = 256 * 1024
    write_max_bytes: int = 10 * 1024 * 1024
    search_max_results: int = 200
    search_max_file_bytes: int = 2 * 1024 * 1024
    search_timeout_seconds: float = 30.0
    """A whole file.search, matching included: a backtracking pattern ends here with an error."""
    shell_default_timeout_seconds: float = 120.0
    shell_max_timeout_seconds: float = 600.0
    shell_output_max_bytes: int = 64 * 1024
    fetch_max_bytes: int = 2 * 1024 * 1024
    fetch_timeout_seconds: float = 30.0
    fetch_max_redirects: int = 5


@dataclass(frozen=True)
class ToolContext:
    workspace: Path
    mounts: tuple[Mount, ...] = ()
    limits: ToolLimits = field(default_factory=ToolLimits)
    allow_private_network: bool = False
    """web.fetch may reach loopback, private and link-local addresses (tests, local models)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment for shell.exec (the runner passes a scrubbed copy: no token, no keys)."""


class SandboxTool(Protocol):
    definition: ToolDefinition

    def kind(self, args: dict[str, Any]) -> CallKind: ...

    def paths(self, args: dict[str, Any], ctx: ToolContext) -> tuple[Path, ...]:
        """The canonical paths a call writes, or reads (so a read and an overlapping write of
        the same response run in call order); empty when it touches no workspace path, and
        for exclusive calls."""
        ...

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult: ...


@runtime_checkable
class TimedTool(Protocol):
    """A sandbox tool that ends a call at a time limit of its own (shell.exec's timeout): the
    tool round gives such a call that long, even past the round's own limit."""

    def allowed_seconds(self, args: dict[str, Any], ctx: ToolContext) -> float:
        """How long a call with `args` may take before the tool itself ends it; never raises
        (bad arguments: 0, the call fails at once)."""
        ...
