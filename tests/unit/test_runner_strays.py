"""What an activation's commands leave running ends with it; the children its process had
before the first command are not the commands' (a process running an activation inside itself,
as a test does, keeps its servers: ending them took a test worker's Postgres and NATS)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from suzumio.runner import strays


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "60"], start_new_session=True)  # noqa: S607


async def test_the_commands_children_end_and_those_from_before_them_stay() -> None:
    before = _sleeper()  # like a test's server, started before the activation
    command = None
    try:
        strays.starting_command()
        command = _sleeper()  # the command's process, still running at the end
        strays.starting_command()  # a second command of the same activation: nothing changes
        assert await strays.end_children() == 1
        assert not Path(f"/proc/{command.pid}").exists()  # killed and reaped
        assert before.poll() is None
        assert await strays.end_children() == 0  # no command since: no look at all
    finally:
        for proc in (before, command):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


async def test_an_activation_without_commands_ends_no_child() -> None:
    before = _sleeper()
    try:
        assert await strays.end_children() == 0
        assert before.poll() is None
    finally:
        before.kill()
        before.wait()
