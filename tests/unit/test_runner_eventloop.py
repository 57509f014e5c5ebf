"""The runner's processes run on uvloop where it is installed, on asyncio's loop otherwise."""

from __future__ import annotations

import asyncio
import sys

import pytest
import uvloop

from suzumio.runner import eventloop


async def _loop_type() -> type[asyncio.AbstractEventLoop]:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop())


def test_runs_on_uvloop_when_installed() -> None:
    assert issubclass(eventloop.run(_loop_type()), uvloop.Loop)


def test_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now fails
    loop_type = eventloop.run(_loop_type())
    assert not issubclass(loop_type, uvloop.Loop)
    assert issubclass(loop_type, asyncio.BaseEventLoop)
