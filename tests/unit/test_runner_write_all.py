"""A runner's line to the fork server (a resident's answer, the server's to the worker) goes
out whole though a write comes back short, as one over PIPE_BUF may when a signal arrives."""

from __future__ import annotations

import os

import pytest

from suzumio.runner import forkserver


def test_a_short_write_is_followed_by_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    read, write = os.pipe()
    real_write = os.write

    def short(fd: int, data: bytes | memoryview) -> int:
        return real_write(fd, bytes(data[:3]))  # as if a signal cut each write short

    monkeypatch.setattr(os, "write", short)
    line = b'{"id": 1, "done": 0, "tail": "' + b"x" * 100 + b'"}\n'
    forkserver.write_all(write, line)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        assert pipe.read() == line
