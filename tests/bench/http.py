"""A minimal keep-alive HTTP/1.1 client for load generation: measuring the server, not the
client library (httpx costs more CPU per request than the routes it would measure)."""

from __future__ import annotations

import asyncio
import json
from typing import Any


class Connection:
    def __init__(self, host: str, port: int, headers: dict[str, str]) -> None:
        self._host, self._port = host, port
        self._headers = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(self._host, self._port)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    async def request(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        assert self._reader is not None
        assert self._writer is not None
        payload = json.dumps(body).encode() if body is not None else b""
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self._host}\r\n{self._headers}"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        self._writer.write(head.encode() + payload)
        status_line = await self._reader.readline()
        status = int(status_line.split()[1])
        length = 0
        while (line := await self._reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return status, await self._reader.readexactly(length)
