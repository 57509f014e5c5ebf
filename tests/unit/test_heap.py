"""A service (and a pool worker) settles its collector once started: what start-up built is
frozen, out of every collection's sight, and young collections are spaced out. Checked in a
child process, whose collector the test may change."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import gc, json, importlib
heap = importlib.import_module({module!r})
built = [[i] for i in range(1000)]  # start-up's objects
before = gc.get_freeze_count()
heap.settle()
print(json.dumps({{"before": before, "frozen": gc.get_freeze_count(),
                  "thresholds": gc.get_threshold(), "built": len(built)}}))
"""


@pytest.mark.parametrize("module", ["suzumio.platform.service.heap", "suzumio.runner.heap"])
def test_settling_freezes_what_start_up_built_and_spaces_collections(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    seen = json.loads(done.stdout)
    assert seen["before"] == 0
    assert seen["frozen"] >= 1000  # every list built before, at least
    assert seen["thresholds"] == [20_000, 20, 20]
