"""`shell.exec`: run a command in the sandbox with a deadline, bounded output, and a kill that
reaches every process the command started.

- The command runs as `/bin/sh -c <command>` in a new session, hence its own process group;
  stdin is `/dev/null` and the environment is exactly `ctx.env` (never the runner's own, which
  holds the activation token).
- stdout and stderr share one pipe (as with `2>&1`), so the model reads them interleaved in the
  order they were written.
- The output keeps the first and the last half of `shell_output_max_bytes` and counts what lies
  between (`[... N bytes omitted ...]`). Data is consumed by a protocol callback and dropped as
  it comes, so a command printing gigabytes costs CPU, never memory, and never blocks on a full
  pipe.
- A non-zero exit is an ordinary result (`[exit 1 ...]`, status "ok"): failing tests are
  information, not a tool failure. Past the deadline the whole group gets SIGTERM, a short
  grace, then SIGKILL, and the status is "timeout". A cancelled call SIGKILLs the group at once,
  also when the cancel lands while the shell is being started.
- Background jobs that outlive the shell are left running (a dev server started with `&` is
  legitimate); if one still holds the output pipe, the result is returned after a short drain
  and whatever it prints later is read and dropped (the pipe stays open until the last such
  job ends: closed, its next write would kill it).
"""

from __future__ import annotations

import asyncio
import codecs
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from suzumio.contracts.runner import ToolDefinition
from suzumio.runner import strays
from suzumio.runner.tools.base import CallKind, ToolContext, ToolInputError, ToolResult
from suzumio.runner.tools.paths import (
    check_keys,
    object_schema,
    optional_number,
    optional_str,
    required_str,
    resolve,
)

_DRAIN_SECONDS = 0.5
_POLL_SECONDS = 0.05
_REAP_SECONDS = 1.0


class OutputBuffer:
    """The head and tail of a stream, bounded by `cap` bytes, with a count of the rest."""

    def __init__(self, cap: int) -> None:
        self._head_cap = max(cap, 2) // 2
        self._tail_cap = max(cap, 2) - self._head_cap
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if len(data) >= self._tail_cap:
            self._tail = bytearray(data[-self._tail_cap :])
        elif data:
            self._tail += data
            del self._tail[: max(0, len(self._tail) - self._tail_cap)]

    def render(self) -> str:
        omitted = self.total - len(self._head) - len(self._tail)
        if omitted == 0:
            return (self._head + self._tail).decode("utf-8", "replace")
        # Cut edges may split a UTF-8 sequence: drop the fragments rather than grow the text
        # with replacement characters.
        head = codecs.getincrementaldecoder("utf-8")("replace").decode(bytes(self._head))
        tail = bytes(self._tail)
        skip = 0
        while skip < min(3, len(tail)) and tail[skip] & 0xC0 == 0x80:
            skip += 1
        return (
            f"{head}\n[... {omitted} bytes omitted ...]\n{tail[skip:].decode('utf-8', 'replace')}"
        )


class _Collector(asyncio.SubprocessProtocol):
    def __init__(self, output: OutputBuffer, loop: asyncio.AbstractEventLoop) -> None:
        self.output: OutputBuffer | None = output  # None: the call returned, output dropped
        self.exited: asyncio.Future[None] = loop.create_future()
        self.drained: asyncio.Future[None] = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        del fd  # stderr is merged into stdout: one pipe
        if self.output is not None:
            self.output.add(data if isinstance(data, bytes) else data.encode())

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        del fd, exc
        if not self.drained.done():
            self.drained.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


class ShellExec:
    definition = ToolDefinition(
        name="shell.exec",
        description=(
            "Run a shell command with /bin/sh -c in the sandbox and return its combined "
            "stdout and stderr and its exit code. No stdin: commands must not wait for input. "
            "Long output keeps its beginning and end. The whole process group is killed at "
            "the timeout; a background job (`cmd > log 2>&1 &`) keeps running after the call."
        ),
        parameters=object_schema(
            {
                "command": {"type": "string", "minLength": 1, "description": "Shell command."},
                "timeout_seconds": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "description": "Deadline in seconds (default and maximum set by the runner).",
                },
                "cwd": {
                    "type": "string",
                    "description": "Working directory inside the workspace or a mount (default .).",
                },
            },
            required=("command",),
        ),
    )
    _keys = frozenset({"command", "timeout_seconds", "cwd"})

    def __init__(self, *, kill_grace_seconds: float = 2.0, shell: str = "/bin/sh") -> None:
        self._grace = kill_grace_seconds
        self._shell = shell

    def kind(self, args: dict[str, Any]) -> CallKind:
        del args
        return "exclusive"

    def paths(self, args: dict[str, Any], ctx: ToolContext) -> tuple[Path, ...]:
        del args, ctx
        return ()

    def allowed_seconds(self, args: dict[str, Any], ctx: ToolContext) -> float:
        # The timeout it will run with, the kill's grace, the reaping and the last output.
        try:
            timeout, _ = _timeout(optional_number(args, "timeout_seconds"), ctx)
        except (ToolInputError, OverflowError):  # an integer past a float's range
            return 0.0
        return timeout + self._grace + _REAP_SECONDS + _DRAIN_SECONDS

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            check_keys(args, self._keys)
            command = _command(args)
            timeout, note = _timeout(optional_number(args, "timeout_seconds"), ctx)
            cwd = _cwd(args, ctx)
        except ToolInputError as exc:
            return ToolResult(str(exc), "error")
        result = await self._execute(command, timeout, cwd, ctx)
        return ToolResult(note + result.text, result.status) if note else result

    async def _execute(
        self, command: str, timeout: float, cwd: Path, ctx: ToolContext
    ) -> ToolResult:
        loop = asyncio.get_running_loop()
        output = OutputBuffer(ctx.limits.shell_output_max_bytes)
        started = loop.time()
        strays.starting_command()  # what it leaves running ends with the activation
        spawn = asyncio.ensure_future(
            loop.subprocess_exec(
                lambda: _Collector(output, loop),
                *(self._shell, "-c", command),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=dict(ctx.env),
                start_new_session=True,
            )
        )
        try:
            # The shell runs before asyncio has connected its pipes; a cancel landing in that
            # window would make asyncio kill the shell alone and leave what it already started.
            transport, proto = await asyncio.shield(spawn)
        except asyncio.CancelledError:
            spawn.add_done_callback(_kill_spawned_group)
            raise
        except OSError as exc:
            return ToolResult(f"cannot start {self._shell}: {exc.strerror}", "error")
        except ValueError as exc:  # a NUL or a lone surrogate cannot be passed to exec
            return ToolResult(f"the command cannot be run: {exc}", "error")
        group = transport.get_pid()
        held = False  # background jobs still write to the pipe after the call returned
        try:
            # asyncio.wait, unlike wait_for, never cancels the futures it watches.
            done, _ = await asyncio.wait({proto.exited}, timeout=timeout)
            if not done:
                await _terminate(group, self._grace)
                await asyncio.wait({proto.exited}, timeout=_REAP_SECONDS)
                trailer = f"[timed out after {timeout:g}s; process group killed]"
                return ToolResult(_with_trailer(output, trailer), "timeout")
            await asyncio.wait({proto.drained}, timeout=_DRAIN_SECONDS)
            elapsed = loop.time() - started
            trailer = f"[{_exit_text(transport.get_returncode())} in {elapsed:.2f}s]"
            if not proto.drained.done():
                trailer += " [background processes still hold the output; later output dropped]"
                held = True
            return ToolResult(_with_trailer(output, trailer))
        except BaseException:
            _signal_group(group, signal.SIGKILL)
            raise
        finally:
            if held:
                # The pipe stays open, what comes dropped, until the last job holding it ends
                # (at the latest with the activation, which ends what its commands left):
                # closed now, a job's next write killed it (SIGPIPE) — a dev server started
                # with `&` died at its first log line.
                proto.output = None
                proto.drained.add_done_callback(lambda _: transport.close())
            else:
                transport.close()


def _command(args: dict[str, Any]) -> str:
    command = required_str(args, "command")
    if "\x00" in command:
        # exec takes C strings: asyncio refuses a NUL, uvloop silently runs the part before
        # it, which is not the command the model sent, the audit recorded or a person approved.
        raise ToolInputError("command contains a NUL character")
    return command


def _cwd(args: dict[str, Any], ctx: ToolContext) -> Path:
    cwd = resolve(optional_str(args, "cwd") or ".", ctx, name="cwd").path
    if not cwd.is_dir():
        raise ToolInputError(f"cwd {args.get('cwd')!r} is not a directory")
    return cwd


def _timeout(requested: float | None, ctx: ToolContext) -> tuple[float, str]:
    limits = ctx.limits
    if requested is None:
        return min(limits.shell_default_timeout_seconds, limits.shell_max_timeout_seconds), ""
    if requested > limits.shell_max_timeout_seconds:
        cap = limits.shell_max_timeout_seconds
        return cap, f"[timeout_seconds lowered to the maximum, {cap:g}s]\n"
    return requested, ""


def _with_trailer(output: OutputBuffer, trailer: str) -> str:
    text = output.render() if output.total else "(no output)"
    return f"{text}\n{trailer}" if text.endswith("\n") else f"{text}\n\n{trailer}"


def _exit_text(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


async def _terminate(group: int, grace: float) -> None:
    """SIGTERM the group, give it `grace` seconds, then SIGKILL whatever is left (a process
    that traps or ignores SIGTERM must not outlive the call)."""
    if not _signal_group(group, signal.SIGTERM):
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    while loop.time() < deadline:
        await asyncio.sleep(_POLL_SECONDS)
        if not _group_alive(group):
            return
    _signal_group(group, signal.SIGKILL)


def _kill_spawned_group(
    spawn: asyncio.Future[tuple[asyncio.SubprocessTransport, _Collector]],
) -> None:
    """End what a spawn started after its caller was cancelled."""
    if spawn.cancelled() or spawn.exception() is not None:
        return
    transport, _ = spawn.result()
    _signal_group(transport.get_pid(), signal.SIGKILL)
    transport.close()


def _signal_group(group: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        return False
    return True


def _group_alive(group: int) -> bool:
    """Whether a live (non-zombie) process remains in the group. Zombies count as members for
    `killpg(…, 0)` and may never be reaped when the sandbox's PID 1 does not reap, so /proc is
    read where it exists."""
    proc = Path("/proc")
    if not proc.is_dir():
        return _signal_group(group, signal.Signals(0))
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            return True
    return False
