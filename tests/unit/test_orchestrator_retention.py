"""The orchestrator's retention of session directories: a session whose log cannot be read
keeps only its own directory; the sweep goes on to the others (it stopped the whole pass,
every pass, and directories piled up)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from suzumio.contracts.ids import new_id
from suzumio.orchestrator import retention


async def test_a_session_whose_closing_cannot_be_read_holds_up_no_other(tmp_path: Path) -> None:
    long_ago = time.time() - 7 * 24 * 3600
    unreadable, closed, still_open = new_id(), new_id(), new_id()
    for name in (unreadable, closed, still_open):
        (tmp_path / name).mkdir()
        (tmp_path / name / "notes.txt").write_text("x")
        os.utime(tmp_path / name / "notes.txt", (long_ago, long_ago))
        os.utime(tmp_path / name, (long_ago, long_ago))

    async def closed_at(session_id: str) -> float | None:
        if session_id == unreadable:
            raise ValueError("an event of a newer release")
        return long_ago if session_id == closed else None

    await retention.sweep_sessions(tmp_path, time.time() - 3600, set(), closed_at)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([unreadable, still_open])
