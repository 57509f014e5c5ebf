"""An ASGI app served on the test's own event loop: uvicorn without its signal handling, on a
socket bound here (so the port is known before it serves), stopped at once on request."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import uvicorn
from starlette.types import ASGIApp


class _Uvicorn(uvicorn.Server):
    """Leaves the process's SIGINT/SIGTERM handlers alone and stops as soon as `stopping` is
    set, instead of polling a flag every 0.1 s."""

    def __init__(self, config: uvicorn.Config, stopping: asyncio.Event) -> None:
        super().__init__(config)
        self.stopping = stopping

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def main_loop(self) -> None:
        await self.on_tick(0)  # sets the default response headers once
        await self.stopping.wait()


class InProcessServer:
    def __init__(self, app: ASGIApp, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app, self.host, self.port = app, host, port
        self.closing = asyncio.Event()
        """Set when the server stops: long waits inside the app should end then."""
        self._uvicorn: _Uvicorn | None = None
        self._serving: asyncio.Task[None] | None = None

    @property
    def serving(self) -> bool:
        return self._serving is not None

    async def start(self, what: str) -> int:
        """Serve; the port it listens on."""
        # IPPROTO_TCP, not 0: asyncio turns Nagle off only for sockets that say they are TCP,
        # and with it on every answer on a kept-alive connection waits for a delayed ACK.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            http="h11",
            ws="none",
            lifespan="off",
            interface="asgi3",
            proxy_headers=False,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=2,
        )
        self.closing.clear()
        self._uvicorn = _Uvicorn(config, self.closing)
        self._serving = asyncio.create_task(self._uvicorn.serve(sockets=[sock]))
        while not self._uvicorn.started:
            if self._serving.done():
                self._serving.result()
                raise RuntimeError(f"the {what} stopped while starting")
            await asyncio.sleep(0.002)
        return self.port

    async def stop(self) -> None:
        if self._uvicorn is None or self._serving is None:
            return
        self._uvicorn.should_exit = True
        self.closing.set()
        await self._serving
        self._uvicorn = None
        self._serving = None
