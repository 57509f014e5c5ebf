"""Processes an activation's commands leave behind, and ending them with it.

A shell command's background process (`server &`) outlives its shell, and its own session or
process group keeps it out of reach of a signal to the runner's group. The runner makes itself
a child subreaper, so such an orphan becomes the runner's child rather than init's, and ends
every child it still has when its activation ends (`end_children`: again until none is left,
as each kill may orphan another) — a process running an activation inside itself (a test)
keeps those it had before the activation's first command. The fork server is one too: what
a runner leaves it (killed outright, or orphaned after its last look) comes to it, and it
ends that whenever it reaps a runner. (A worker killed outright
takes the fork server and the runners with it; what they leave then goes to init.)

Linux only (`prctl`); elsewhere these do nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Collection
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36
REAP_SECONDS = 2.0
KILL_PASSES = 5  # a daemon's child orphaned by each kill: generations deep


class _Started:
    """Whether this process started a command since it last ended its children (a resident
    runner's activations that ran none skip the look through /proc), and the children it had
    before the first of them: not the commands' to end. A runner has none of its own; a
    process that runs an activation inside itself (a test) keeps its servers."""

    commands = False
    before: frozenset[int] = frozenset()
    runner = False  # a runner's children are all its commands' (`as_runner`)


def become_subreaper() -> bool:
    """Orphans of this process's descendants become its children; whether that took."""
    if sys.platform != "linux":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0


def as_runner() -> bool:
    """This process is a runner: a subreaper (`become_subreaper`), every child of which is its
    commands' — none kept at an activation's end. (Kept as "had before the first command", a
    resident runner's strays of one activation were its next one's to keep, for good.)"""
    _Started.runner = True
    return become_subreaper()


def starting_command() -> None:
    """A tool is about to start a command (its process group may leave children behind)."""
    if not _Started.commands:
        _Started.before = frozenset() if _Started.runner else frozenset(children(os.getpid()))
        _Started.commands = True


def children(parent: int) -> list[int]:
    """The pids whose parent is `parent` (read from /proc: a kernel without
    CONFIG_PROC_CHILDREN has no quicker list)."""
    found: list[int] = []
    try:
        entries = [p for p in Path("/proc").iterdir() if p.name.isdigit()]
    except OSError:
        return found
    for entry in entries:
        try:
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue  # gone meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == parent:
            found.append(int(entry.name))
    return found


def kill_with_group(pid: int) -> None:
    """SIGKILL `pid` and its process group (unless that group is ours)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        group = os.getpgid(pid)
        if group != os.getpgrp():
            os.killpg(group, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def kill_children(keep: Collection[int] = ()) -> list[int]:
    """SIGKILL every child of this process but `keep`, each with its group; their pids."""
    strays = [pid for pid in children(os.getpid()) if pid not in keep]
    for pid in strays:
        kill_with_group(pid)
    return strays


def reaped(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True  # not ours (any more)
    return done == pid


async def end_children() -> int:
    """At an activation's end: end what its commands left running, and reap it (a killed
    process in the middle of a system call takes a moment). How many there were.

    Again until a look finds none (bounded): a descendant whose parent was alive at the first
    look (a daemon's detached child) is orphaned by that kill, and comes to this subreaper
    only then."""
    if not _Started.commands:
        return 0
    _Started.commands = False
    keep, _Started.before = _Started.before, frozenset()
    ended: set[int] = set()
    deadline = time.monotonic() + REAP_SECONDS
    for _ in range(KILL_PASSES):
        strays = kill_children(keep=keep)
        if not strays:
            break
        ended.update(strays)
        waiting = [pid for pid in strays if not reaped(pid)]
        while waiting and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
            waiting = [pid for pid in waiting if not reaped(pid)]
    return len(ended)
