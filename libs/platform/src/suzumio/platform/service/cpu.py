"""The CPU scheduling policy of the platform's processes: Linux's `SCHED_BATCH` by default.

An activation wakes the platform's processes dozens of times (each publish wakes the NATS
server, each delivery a follower, each reply its caller). Under the default policy a process
woken while the CPUs are busy preempts the one running, which pays for it in a context switch
and in the caches it had warmed; under `SCHED_BATCH` the woken process waits for the running
one's time slice instead. While a CPU is free nothing changes: a woken process runs at once
on it. What it gains on a busy machine: docs/operations.md.

A process applies it at its start, and what it starts afterwards takes it from it: the
embedded servers, a pool worker's fork server and runners, the process backend's runners.
`inherit` leaves the policy the process was started with, and a process started under
another policy than the default one (`chrt --idle`, a real-time policy) keeps it either way.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Literal

CpuPolicy = Literal["batch", "inherit"]


def apply(policy: CpuPolicy) -> str | None:
    """Put every thread of this process under `policy` (threads started later take it from
    the one that starts them, child processes from their parent); why not, if it could not
    be (another OS, a sandbox that refuses it). None when done or nothing was to be done."""
    if policy == "inherit":
        return None
    setter = getattr(os, "sched_setscheduler", None)
    if setter is None or not hasattr(os, "SCHED_BATCH"):
        return "this platform has no SCHED_BATCH"
    keep = getattr(os, "SCHED_RESET_ON_FORK", 0)  # an operator's flag: it stays as it is
    try:
        threads = [int(t.name) for t in Path("/proc/self/task").iterdir()]
    except OSError:
        if threading.active_count() > 1:
            return "its threads cannot be listed (/proc/self/task)"
        threads = [0]  # the only thread: the calling one
    for tid in threads:
        try:
            current = os.sched_getscheduler(tid)
            if current & ~keep == os.SCHED_OTHER:
                setter(tid, os.SCHED_BATCH | (current & keep), os.sched_param(0))
        except ProcessLookupError:
            continue  # a thread that ended meanwhile
        except OSError as exc:
            return f"SCHED_BATCH refused: {exc.strerror or exc}"
    return None
