"""Identifiers: UUIDv7 for events and new aggregates, and the id syntax subjects accept."""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from typing import Annotated

from pydantic import StringConstraints

# NATS subject tokens may not contain '.', '*', '>' or whitespace; ids become subject tokens.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
Identifier = Annotated[str, StringConstraints(pattern=ID_PATTERN)]
_ID_RE = re.compile(ID_PATTERN)

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def _uuid7_int() -> int:
    global _last_ms, _counter  # noqa: PLW0603 - process-wide monotonic clock state
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms = ms
            _counter = int.from_bytes(os.urandom(2), "big") & 0x7FF
        else:
            _counter += 1
            if _counter > 0xFFF:  # counter exhausted: borrow the next millisecond
                _last_ms += 1
                _counter = 0
        ms, counter = _last_ms, _counter
    rand_b = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    return (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | rand_b


def uuid7() -> uuid.UUID:
    """A UUIDv7 (RFC 9562): millisecond time order, monotonic within one process.

    Within one millisecond the 12-bit `rand_a` field is a counter started at a random value,
    so ids minted in a burst still sort in creation order.
    """
    return uuid.UUID(int=_uuid7_int())


def new_id() -> str:
    """A fresh UUIDv7 in canonical text form, usable as an id and as a subject token."""
    h = f"{_uuid7_int():032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_DERIVED_NAMESPACE = uuid.UUID("5b1d7c1e-8a4f-4c52-9a0e-2f4c6b3d9e71")


def derived_id(*parts: str) -> str:
    """A stable id computed from `parts` (a UUIDv5): the same inputs always give the same id,
    so a step retried after a crash names the same aggregate or signal and is deduplicated."""
    return str(uuid.uuid5(_DERIVED_NAMESPACE, "\x1f".join(parts)))


def is_valid_id(value: str) -> bool:
    """Whether `value` can be used as an aggregate id (and so as a subject token)."""
    return _ID_RE.fullmatch(value) is not None
