"""The runner's log: one JSON object per line on stderr (the sandbox's log), no secrets.

The runner depends on `suzumio.contracts` alone, so this is not the services' structlog
setup; the orchestrator collects stderr with the activation's ids.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

TAIL_BYTES = 2_000  # of a log, in an exit's report

context: dict[str, str] = {}


def log(event: str, **fields: Any) -> None:
    record = {"ts": round(time.time(), 3), "event": event, **context, **fields}
    sys.stderr.write(json.dumps(record, default=str) + "\n")
    sys.stderr.flush()


def tail(path: Path, since: int = 0) -> str:
    """The last `TAIL_BYTES` of a log, from byte `since` on (where an activation's lines
    began in a resident runner's log); empty if it cannot be read."""
    try:
        with path.open("rb") as f:
            f.seek(max(f.seek(0, 2) - TAIL_BYTES, since, 0))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
