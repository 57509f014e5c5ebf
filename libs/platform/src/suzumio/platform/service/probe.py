"""A tiny HTTP GET for polling health endpoints, so supervisors and tests need no HTTP client."""

from __future__ import annotations

import asyncio


async def get(host: str, port: int, path: str, timeout: float = 2.0) -> tuple[int, bytes] | None:
    """The HTTP status and body of `GET path`, or None when nothing answered.

    The body is what follows the head up to the end of the connection, as the endpoints polled
    (health, readiness) answer with a plain JSON body."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError):
        return None
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout)
    except (OSError, TimeoutError):
        return None
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    parts = head.split(b"\r\n", 1)[0].split()
    return (int(parts[1]), body) if len(parts) >= 2 and parts[1].isdigit() else None


async def get_status(host: str, port: int, path: str, timeout: float = 2.0) -> int | None:
    """The HTTP status of `GET path`, or None when nothing answered."""
    answer = await get(host, port, path, timeout)
    return answer[0] if answer is not None else None
