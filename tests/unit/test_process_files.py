"""The files the process backend writes in an activation's directory, which an isolated
sandbox can write too: a FIFO or a link planted there must neither hang nor redirect them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from suzumio.orchestrator.backends.process import _open_own


def test_a_fifo_in_a_files_place_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "runner.log"
    os.mkfifo(fifo)  # no reader: a blocking open for writing would wait forever
    with pytest.raises(OSError):
        _open_own(fifo, os.O_WRONLY | os.O_APPEND)


def test_a_link_in_a_files_place_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "host-file"
    target.write_text("keep")
    (tmp_path / "process.json").symlink_to(target)
    with pytest.raises(OSError):
        _open_own(tmp_path / "process.json", os.O_WRONLY | os.O_TRUNC)
    assert target.read_text() == "keep"


def test_a_regular_file_is_opened_for_blocking_writes(tmp_path: Path) -> None:
    fd = _open_own(tmp_path / "runner.log", os.O_WRONLY | os.O_APPEND)
    try:
        assert os.get_blocking(fd)
        os.write(fd, b"line\n")
    finally:
        os.close(fd)
    assert (tmp_path / "runner.log").read_text() == "line\n"
