"""The platform's processes put themselves under Linux's SCHED_BATCH (a woken process does not
preempt the one running), every thread of theirs, and what they start takes it from them;
`inherit` and a policy the process was started under are left as they are. Checked in child
processes, whose policy the test may change."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import importlib, json, os, subprocess, sys, threading
os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))  # whatever the tests run under
{before}
cpu = importlib.import_module({module!r})
parked = threading.Event()
early = threading.Thread(target=parked.wait)  # started before the policy is applied
early.start()
why_not = cpu.apply({policy!r})
seen = {{}}
late = threading.Thread(target=lambda: seen.update(late=os.sched_getscheduler(0)))
late.start(); late.join()
child = subprocess.run([sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"],
                       capture_output=True, text=True, check=True)
threads = sorted(os.sched_getscheduler(int(t)) for t in os.listdir("/proc/self/task"))
parked.set(); early.join()
print(json.dumps({{"why_not": why_not, "threads": threads, "late": seen["late"],
                  "child": int(child.stdout), "main": os.sched_getscheduler(0)}}))
"""

MODULES = ["suzumio.platform.service.cpu", "suzumio.runner.cpu"]
IDLE = "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))"


def probe(module: str, policy: str, before: str = "") -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module, policy=policy, before=before)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    seen: dict[str, object] = json.loads(done.stdout)
    return seen


@pytest.mark.parametrize("module", MODULES)
def test_batch_covers_every_thread_and_what_the_process_starts(module: str) -> None:
    seen = probe(module, "batch")
    assert seen["why_not"] is None
    assert seen["threads"] == [os.SCHED_BATCH, os.SCHED_BATCH]  # the main one and the early one
    assert seen["late"] == os.SCHED_BATCH
    assert seen["child"] == os.SCHED_BATCH


@pytest.mark.parametrize("module", MODULES)
def test_inherit_leaves_the_policy_as_it_was(module: str) -> None:
    seen = probe(module, "inherit")
    assert seen["why_not"] is None
    assert seen["threads"] == [os.SCHED_OTHER, os.SCHED_OTHER]
    assert seen["late"] == os.SCHED_OTHER
    assert seen["child"] == os.SCHED_OTHER


@pytest.mark.parametrize("module", MODULES)
def test_a_process_started_under_another_policy_keeps_it(module: str) -> None:
    """An operator's `chrt --idle` (or a real-time policy) is a choice: batch does not undo it."""
    seen = probe(module, "batch", before=IDLE)
    assert seen["threads"] == [os.SCHED_IDLE, os.SCHED_IDLE]
    assert seen["child"] == os.SCHED_IDLE


@pytest.mark.parametrize("module", MODULES)
def test_an_operators_reset_on_fork_flag_stays(module: str) -> None:
    flag = os.SCHED_RESET_ON_FORK
    seen = probe(module, "batch", before=f"os.sched_setscheduler(0, {flag}, os.sched_param(0))")
    assert seen["why_not"] is None
    assert seen["main"] == os.SCHED_BATCH | flag
    assert seen["child"] == os.SCHED_BATCH


@pytest.mark.parametrize("module", MODULES)
def test_threads_it_cannot_list_are_reported_not_passed_over(module: str) -> None:
    """Without /proc/self/task only the calling thread could be set: with another thread
    running, that is said, and nothing is changed half-way."""
    no_proc = "import pathlib; pathlib.Path.iterdir = lambda self: (_ for _ in ()).throw(OSError())"
    seen = probe(module, "batch", before=no_proc)
    assert seen["why_not"] == "its threads cannot be listed (/proc/self/task)"
    assert seen["threads"] == [os.SCHED_OTHER, os.SCHED_OTHER]
