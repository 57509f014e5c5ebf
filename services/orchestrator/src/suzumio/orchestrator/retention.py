"""What the retention sweep removes from the sandboxes directory (docs/orchestrator.md).

- `activations/<id>`: an activation's directory, once it ended and its time (set at its end)
  is older than the horizon. Never a live one's.
- `sessions/<id>`: a session's own directory (`/workspace/session`, kept across its
  activations), once the session is closed — the last event of its log is its closing, or,
  when its last activation's entries came after that, the sessions read model has it closed
  as of that last event — and was closed before the horizon, with no live activation of it.
  An open session keeps its directory however long it idles: it holds what its agents keep
  for their next activation.

An entry gone since it was listed (its backend's cleanup at its end) is passed over; a link
in the listing is removed as a link, never followed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Awaitable, Callable, Container
from pathlib import Path

from suzumio.contracts.ids import is_valid_id
from suzumio.platform.logging import get_logger

log = get_logger(__name__)

ClosedAt = Callable[[str], Awaitable[float | None]]
"""When a session was closed (a POSIX time), or None while it is open."""


def _names(root: Path) -> list[str]:
    try:
        with os.scandir(root) as listing:
            return sorted(entry.name for entry in listing)
    except FileNotFoundError:
        return []


def _changed(path: Path) -> float | None:
    try:
        return path.lstat().st_mtime
    except FileNotFoundError:
        return None


def _remove_now(path: Path) -> None:
    if path.is_symlink():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


async def _remove(path: Path) -> None:
    await asyncio.to_thread(_remove_now, path)


async def sweep_activations(root: Path, horizon: float, live: Container[str]) -> None:
    """Remove the directories under `root` of activations not in `live`, unchanged since
    `horizon`."""
    for name in _names(root):
        if name in live:
            continue
        changed = _changed(root / name)
        if changed is not None and changed < horizon:
            await _remove(root / name)


async def sweep_sessions(
    root: Path, horizon: float, live: Container[str], closed_at: ClosedAt
) -> None:
    """Remove the directories under `root` of sessions closed before `horizon`, none of whose
    activations is in `live` (their sessions)."""
    for name in _names(root):
        if name in live or not is_valid_id(name):
            continue
        changed = _changed(root / name)
        if changed is None or changed >= horizon:  # touched since: not closed long enough
            continue
        try:
            closed = await closed_at(name)
        except Exception as exc:  # one session whose log cannot be read keeps only its own
            log.warning("retention.session_unreadable", session=name, error=repr(exc)[:300])
            continue
        if closed is not None and closed < horizon:
            log.info("retention.session_removed", session=name)
            await _remove(root / name)
