"""`suzumio chat`'s reading of stdin (answers typed at a prompt) and of the session's
timeline when the connection drops: stdin's blocking mode stays as it is (at a terminal it
is the live text's output too), a stdin that cannot be waited on means no prompt, and a
stream cut off without its end is resumed from the last cursor."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import pty
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from suzumio.cli import chat, timeline
from suzumio.cli.timeline import StreamRefusedError, read_timeline


async def test_a_terminals_blocking_mode_stays_as_it_is() -> None:
    """Made non-blocking (asyncio's pipe reading does that to the open file, which a shell
    shares between stdin and stdout), a write of the live text to a full terminal raised
    BlockingIOError and ended the chat."""
    master, slave = pty.openpty()
    terminal = os.fdopen(slave, "rb", buffering=0)
    saved = sys.stdin
    sys.stdin = io.TextIOWrapper(terminal)
    try:
        async with chat._stdin_lines(wanted=True) as lines:
            assert lines is not None
            assert os.get_blocking(slave)
            os.write(master, b"yes\n")
            assert await asyncio.wait_for(lines.readline(), 10) == b"yes\n"
            assert os.get_blocking(slave)
    finally:
        sys.stdin = saved
        terminal.close()
        os.close(master)


async def test_lines_come_whole_and_the_rest_at_the_end() -> None:
    read, write = os.pipe()
    loop = asyncio.get_running_loop()
    lines = chat.StdinLines(read)
    loop.add_reader(read, lines.readable)
    try:
        os.write(write, b"first\nsec")
        assert await asyncio.wait_for(lines.readline(), 10) == b"first\n"
        waiting = asyncio.ensure_future(lines.readline())
        await asyncio.sleep(0.05)
        assert not waiting.done()  # half a line is no answer yet
        os.write(write, b"ond\nlast")
        assert await asyncio.wait_for(waiting, 10) == b"second\n"
        os.close(write)
        assert await asyncio.wait_for(lines.readline(), 10) == b"last"
        assert await asyncio.wait_for(lines.readline(), 10) == b""
    finally:
        os.close(read)


@pytest.mark.parametrize("stdin", ["closed", "devnull", "file"])
async def test_a_stdin_that_cannot_be_waited_on_gives_no_prompt(
    stdin: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`chat ... <&-` failed on `sys.stdin.isatty()` after the message was posted; with
    /dev/null each prompt hung until --timeout."""
    if stdin == "closed":
        monkeypatch.setattr(sys, "stdin", None)
        async with chat._stdin_lines(wanted=True) as lines:
            assert lines is None
        return
    path = Path(os.devnull) if stdin == "devnull" else tmp_path / "answers"
    if stdin == "file":
        path.write_text("y\n")
    with path.open() as opened:  # noqa: ASYNC230 - a file that is there, opened at once
        monkeypatch.setattr(sys, "stdin", opened)
        async with chat._stdin_lines(wanted=True) as lines:
            assert lines is None


class Timeline:
    """The gateway's side of `GET /v1/sessions/{id}/stream` as the test scripts it: each
    connection's SSE body (or status), in turn; the cursors asked for."""

    def __init__(self, *answers: tuple[int, str]) -> None:
        self.answers = list(answers)
        self.cursors: list[str] = []

    def answer(self, request: httpx.Request) -> httpx.Response:
        self.cursors.append(request.url.params["since"])
        status, body = self.answers.pop(0)
        return httpx.Response(status, text=body, headers={"content-type": "text/event-stream"})


class Taken:
    def __init__(self) -> None:
        self.items: list[tuple[str, dict[str, Any]]] = []

    def take(self, event: str, data: dict[str, Any]) -> None:
        self.items.append((event, data))


def sse(event: str, item_id: str, data: str) -> str:
    return f"event: {event}\nid: {item_id}\ndata: {data}\n\n"


async def test_a_stream_cut_off_without_its_end_is_resumed_from_the_last_cursor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(timeline, "RECONNECT_SECONDS", 0)
    gateway = Timeline(
        (200, sse("live", "7.3", '{"n": 1}')),  # then the connection closes: no end
        (502, "bad gateway"),  # a proxy while the gateway restarts
        (200, sse("live", "7.4", '{"n": 2}') + sse("end", "", '{"status": 404, "detail": "gone"}')),
    )
    taken = Taken()
    transport = httpx.MockTransport(gateway.answer)
    async with httpx.AsyncClient(base_url="http://gw", transport=transport) as client:
        with pytest.raises(StreamRefusedError, match="gone"):
            await read_timeline(client, "s1", "6.0", taken)
    assert gateway.cursors == ["6.0", "7.3", "7.3"]
    assert taken.items == [("live", {"n": 1}), ("live", {"n": 2})]


async def test_a_stream_that_keeps_dropping_is_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline, "RECONNECT_SECONDS", 0)
    gateway = Timeline(*[(200, "")] * (timeline.RECONNECTS + 1))
    transport = httpx.MockTransport(gateway.answer)
    async with httpx.AsyncClient(base_url="http://gw", transport=transport) as client:
        with pytest.raises(StreamRefusedError, match="closed"):
            await read_timeline(client, "s1", "6.0", Taken())
    assert len(gateway.cursors) == timeline.RECONNECTS + 1


async def test_a_refusal_is_not_asked_again() -> None:
    gateway = Timeline((403, '{"detail": "not a member"}'))
    transport = httpx.MockTransport(gateway.answer)
    async with httpx.AsyncClient(base_url="http://gw", transport=transport) as client:
        with pytest.raises(StreamRefusedError, match="403: not a member"):
            await read_timeline(client, "s1", "6.0", Taken())
    assert gateway.cursors == ["6.0"]


async def test_a_stdin_that_never_stops_is_read_only_as_lines_are_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`yes | suzumio chat ... --interactive`: all of stdin was read into memory as it came."""
    monkeypatch.setattr(chat, "MAX_ANSWER_BYTES", 1024)
    read, write = os.pipe()
    os.set_blocking(write, False)  # the test writes what the pipe takes, then stops
    lines = chat.StdinLines(read)
    lines.start()
    try:
        written = 0
        for _ in range(3):  # filled, read once by the loop, filled again
            with contextlib.suppress(BlockingIOError):
                while True:
                    written += os.write(write, b"y\n" * 512)
            await asyncio.sleep(0.05)
        held = len(lines._buffer)
        assert held <= 65_536 < written  # one read, then the rest waits in the pipe
        assert await asyncio.wait_for(lines.readline(), 10) == b"y\n"
    finally:
        lines.stop()
        os.close(read)
        os.close(write)


async def test_a_gateway_that_ends_every_stream_at_once_is_not_asked_again_and_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """503 ends with nothing before them (the gateway cannot read its log, or drains): asked
    again a second apart, a few times, then given up — not as fast as it answers until the
    command's timeout. A 503 end after items is resumed at once, as ever."""
    pauses: list[float] = []

    async def pause(seconds: float) -> None:
        pauses.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", pause)  # the one timeline waits with
    end = sse("end", "", '{"status": 503, "detail": "the log cannot be read"}')
    gateway = Timeline(
        (200, sse("live", "7.3", '{"n": 1}') + end),  # items, then resume: at once
        *[(200, end)] * (timeline.RECONNECTS + 1),
    )
    taken = Taken()
    transport = httpx.MockTransport(gateway.answer)
    async with httpx.AsyncClient(base_url="http://gw", transport=transport) as client:
        with pytest.raises(StreamRefusedError, match="503"):
            await read_timeline(client, "s1", "6.0", taken)
    assert len(gateway.cursors) == timeline.RECONNECTS + 2
    assert pauses == [timeline.RECONNECT_SECONDS] * timeline.RECONNECTS
    assert taken.items == [("live", {"n": 1})]
