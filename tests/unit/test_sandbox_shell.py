"""`shell.exec` is bounded: its output is capped, its deadline kills every process it started
(also those that ignore SIGTERM), a cancelled call leaves nothing running, and it sees only the
environment it is given."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from suzumio.runner.tools.base import ToolContext, ToolLimits, ToolResult
from suzumio.runner.tools.shell import OutputBuffer, ShellExec

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIVEN": "yes"}


def ctx_for(workspace: Path, **limits: Any) -> ToolContext:
    return ToolContext(workspace=workspace, limits=ToolLimits(**limits), env=dict(ENV))


async def sh(ctx: ToolContext, command: str, **args: Any) -> ToolResult:
    return await ShellExec(kill_grace_seconds=0.3).run({"command": command, **args}, ctx)


def is_dead(pid: int) -> bool:
    """Gone, or a zombie nobody reaped yet (it runs no code any more)."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat_line.rsplit(")", 1)[1].split()[0] == "Z"


async def wait_dead(pid: int, within: float = 3.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if is_dead(pid):
            return True
        await asyncio.sleep(0.05)
    return is_dead(pid)


async def read_pid(path: Path, within: float = 3.0) -> int:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text.endswith("\n"):
            return int(text)
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} was never written")


async def test_runs_in_the_workspace_with_exit_code_and_merged_stderr(tmp_path: Path) -> None:
    result = await sh(ctx_for(tmp_path), "pwd; echo oops >&2; exit 3")
    assert result.status == "ok"
    lines = result.text.splitlines()
    assert lines[:2] == [str(tmp_path), "oops"]
    assert lines[-1].startswith("[exit 3 in ")


async def test_signals_and_silence_are_reported(tmp_path: Path) -> None:
    killed = await sh(ctx_for(tmp_path), "kill -9 $$")
    assert killed.text.startswith("(no output)\n\n[killed by SIGKILL")


async def test_environment_is_only_the_given_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUZUMIO_RUNNER_TOKEN", "must-not-leak")
    result = await sh(ctx_for(tmp_path), "env")
    assert "GIVEN=yes" in result.text
    assert "must-not-leak" not in result.text


async def test_stdin_is_closed(tmp_path: Path) -> None:
    result = await sh(ctx_for(tmp_path), "cat; echo after-cat", timeout_seconds=3)
    assert result.status == "ok"  # `cat` read an end of input, not the deadline's kill
    assert result.text.startswith("after-cat\n")


async def test_cwd_is_confined(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    ctx = ctx_for(tmp_path)
    assert (await sh(ctx, "pwd", cwd="sub")).text.startswith(f"{tmp_path / 'sub'}\n")
    refused = await sh(ctx, "pwd", cwd="..")
    assert refused.status == "error"
    assert "outside the workspace" in refused.text
    assert (await sh(ctx, "pwd", cwd="missing")).status == "error"


async def test_bad_arguments_run_nothing(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    assert (await ShellExec().run({}, ctx)).status == "error"
    assert (await sh(ctx, "touch made", timeout_seconds=0)).status == "error"
    assert (await sh(ctx, "touch made", shell="bash")).status == "error"
    assert not (tmp_path / "made").exists()


async def test_timeout_is_clamped_to_the_maximum(tmp_path: Path) -> None:
    result = await sh(ctx_for(tmp_path, shell_max_timeout_seconds=5), "true", timeout_seconds=99)
    assert result.text.startswith("[timeout_seconds lowered to the maximum, 5s]\n")


async def test_ten_megabytes_of_output_keep_head_and_tail_within_the_cap(tmp_path: Path) -> None:
    cap = 4096
    command = "printf start; head -c 10000000 /dev/zero | tr '\\0' x; printf end"
    result = await sh(ctx_for(tmp_path, shell_output_max_bytes=cap), command)
    output, trailer = result.text.rsplit("\n\n", 1)
    omitted = 10_000_008 - cap
    marker = f"\n[... {omitted} bytes omitted ...]\n"
    assert marker in output
    assert len(output.encode()) == cap + len(marker)
    assert output.startswith("startxxx")
    assert output.endswith("xxxend")
    assert trailer.startswith("[exit 0")


async def test_endless_output_is_bounded_by_the_deadline(tmp_path: Path) -> None:
    result = await sh(ctx_for(tmp_path, shell_output_max_bytes=1000), "yes", timeout_seconds=0.5)
    assert result.status == "timeout"
    assert len(result.text) < 1200
    assert result.text.endswith("[timed out after 0.5s; process group killed]")


async def test_timeout_kills_the_whole_group_even_processes_ignoring_term(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    survived = tmp_path / "survived"
    # The grandchild (and its `sleep`, which inherits the ignored TERM) would write `survived`
    # had the call waited for it to end on its own rather than killed it.
    command = f"sh -c 'trap \"\" TERM; echo $$ > {pid_file}; sleep 30; touch {survived}' & wait"
    result = await sh(ctx_for(tmp_path), command, timeout_seconds=1)
    assert result.status == "timeout"
    assert result.text.endswith("[timed out after 1s; process group killed]")
    grandchild = await read_pid(pid_file)
    assert await wait_dead(grandchild), f"grandchild {grandchild} survived the timeout"
    assert not survived.exists()


async def cancel_once_the_job_runs(tmp_path: Path) -> int:
    """Cancels a call whose shell started a background `sleep`; returns the sleep's pid."""
    pid_file = tmp_path / "pids"
    command = f"sleep 30 & echo $! > {pid_file}; wait"
    call = asyncio.create_task(sh(ctx_for(tmp_path), command, timeout_seconds=20))
    sleeper = await read_pid(pid_file)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    return sleeper


async def test_cancellation_kills_the_group(tmp_path: Path) -> None:
    sleeper = await cancel_once_the_job_runs(tmp_path)
    assert await wait_dead(sleeper), f"sleep {sleeper} survived the cancellation"


async def test_cancellation_while_the_shell_is_being_started_kills_the_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shell runs before asyncio has connected its pipes. The spawn here returns only once
    the shell's background job exists, so the cancel lands inside it, deterministically."""
    pid_file = tmp_path / "pids"
    loop = asyncio.get_running_loop()
    real_spawn = loop.subprocess_exec

    async def slow_spawn(*args: Any, **kwargs: Any) -> Any:
        started = await real_spawn(*args, **kwargs)
        await read_pid(pid_file)
        await asyncio.sleep(0.2)
        return started

    monkeypatch.setattr(loop, "subprocess_exec", slow_spawn)
    sleeper = await cancel_once_the_job_runs(tmp_path)
    assert await wait_dead(sleeper), f"sleep {sleeper} survived the cancellation"


async def test_background_jobs_do_not_hold_the_call(tmp_path: Path) -> None:
    pid_file = tmp_path / "bg.pid"
    result = await sh(ctx_for(tmp_path), f"sleep 5 & echo $! > {pid_file}; echo started")
    try:
        assert result.status == "ok"
        assert not is_dead(await read_pid(pid_file))  # returned while the job still ran
        assert result.text.startswith("started\n")
        assert "background processes still hold the output" in result.text
    finally:
        os.kill(await read_pid(pid_file), 9)


async def test_a_background_job_that_writes_after_the_call_goes_on(tmp_path: Path) -> None:
    """The call closed the pipe as it returned: the job's next write killed it (SIGPIPE) — a
    dev server started with `&` died at its first log line."""
    done = tmp_path / "done"
    result = await sh(ctx_for(tmp_path), f"(sleep 1; echo late; echo ok > {done}) & echo started")
    assert "background processes still hold the output" in result.text
    for _ in range(50):  # bounds the wait; the job needs ~0.5 s more
        if done.exists():
            break
        await asyncio.sleep(0.1)
    assert done.read_text() == "ok\n"  # it wrote "late", and lived on to write this
    assert "late" not in result.text.splitlines()  # what it wrote after the call is dropped


def test_output_buffer_keeps_head_and_tail() -> None:
    buffer = OutputBuffer(10)
    for piece in (b"abc", b"defgh", b"ijklmnop", b"qrstuvwxyz"):
        buffer.add(piece)
    assert buffer.total == 26
    assert buffer.render() == "abcde\n[... 16 bytes omitted ...]\nvwxyz"
    small = OutputBuffer(10)
    small.add(b"short")
    assert small.render() == "short"


def test_output_buffer_does_not_split_characters() -> None:
    buffer = OutputBuffer(6)
    buffer.add("ééééé".encode())  # 10 bytes: every cut lands inside a character
    text = buffer.render()
    assert "\ufffd" not in text
    assert text == "é\n[... 4 bytes omitted ...]\né"
