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
secrets: list[str] = []
"""The activation's secrets (its token, the provider keys of its environment): never written
here, whatever a line carries (a provider's error text, say). A log's tail goes into the
activation's events when it fails."""
MIN_SECRET_CHARS = 8  # shorter values ("none") are placeholders, and common words


def keep_secret(*values: str) -> None:
    secrets.extend(v for v in values if len(v) >= MIN_SECRET_CHARS)


def redacted(text: str) -> str:
    """`text` with the activation's secrets replaced."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, "[redacted]")
    return text


def log(event: str, **fields: Any) -> None:
    record = {"ts": round(time.time(), 3), "event": event, **context, **fields}
    line = redacted(json.dumps(record, default=str))
    sys.stderr.write(line + "\n")
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
