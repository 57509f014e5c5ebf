"""What an activation's commands leave running ends with it; the children its process had
before the first command are not the commands' (a process running an activation inside itself,
as a test does, keeps its servers: ending them took a test worker's Postgres and NATS)."""

from __future__ import annotations

import subprocess
import sys
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


RUNNER = """
import asyncio, os, subprocess, sys
from suzumio.runner import strays

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

assert strays.as_runner()
earlier = subprocess.Popen(["sleep", "60"], start_new_session=True)  # an earlier activation's
strays.starting_command()
# A daemon in a session of its own, with a child in another: the kill of the first orphans
# the second, which comes to this subreaper only then.
daemon = subprocess.Popen(
    ["sh", "-c", "setsid sleep 60 & echo $!; exec sleep 60"],
    start_new_session=True,
    stdout=subprocess.PIPE,
)
orphan = int(daemon.stdout.readline())
ended = asyncio.run(strays.end_children())
print(ended, alive(earlier.pid), alive(daemon.pid), alive(orphan))
"""


def test_a_runner_ends_every_child_its_commands_left_generations_deep() -> None:
    """A runner (a subreaper) keeps no child at an activation's end: a resident runner's
    strays of one activation were its next one's "from before", kept for good. And a
    descendant orphaned by the kill of its parent (a daemon's child) ends too: one look at
    the children, it came after it and lived on. (In a process of its own: a subreaper.)"""
    done = subprocess.run(
        [sys.executable, "-c", RUNNER], capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [b"3", b"False", b"False", b"False"]
