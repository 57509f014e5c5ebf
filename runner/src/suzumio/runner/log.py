"""The runner's log: one JSON object per line on stderr (the sandbox's log), no secrets.

The runner depends on `suzumio.contracts` alone, so this is not the services' structlog
setup; the orchestrator collects stderr with the activation's ids.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

context: dict[str, str] = {}


def log(event: str, **fields: Any) -> None:
    record = {"ts": round(time.time(), 3), "event": event, **context, **fields}
    sys.stderr.write(json.dumps(record, default=str) + "\n")
    sys.stderr.flush()
