"""The cyclic collector of a pool worker, settled once it has started (as the services' are:
`suzumio.platform.service.heap`, which the runner does not depend on). With the default
thresholds the collector took ~9% of a busy worker's CPU. The fork server freezes its own heap
for its runners' sake (`forkserver`)."""

from __future__ import annotations

import gc

THRESHOLDS = (20_000, 20, 20)


def settle() -> None:
    """Freeze what start-up built and space the collections out (call once, when started)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
