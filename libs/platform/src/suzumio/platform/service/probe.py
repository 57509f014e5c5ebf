"""A tiny HTTP GET for polling health endpoints, so supervisors and tests need no HTTP client."""

from __future__ import annotations

import asyncio


async def get_status(host: str, port: int, path: str, timeout: float = 2.0) -> int | None:
    """The HTTP status of `GET path`, or None when nothing answered."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError):
        return None
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout)
    except (OSError, TimeoutError):
        return None
    finally:
        writer.close()
    parts = line.split()
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None
