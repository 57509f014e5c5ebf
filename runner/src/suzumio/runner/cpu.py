"""The CPU scheduling policy of a pool worker, its fork server and its runners (they take it
from the worker): Linux's `SCHED_BATCH` by default, as the services' (the same function as
`suzumio.platform.service.cpu`, which says why; the runner does not depend on the platform).
`inherit` leaves the policy the worker was started with."""

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
