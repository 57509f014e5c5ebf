"""A session's timeline (`GET /v1/sessions/{id}/stream`, SSE) as the CLI reads it: items of
(event, data, cursor), resumed from the last cursor when the gateway ends the stream with 503
(live output restarted, a slow reader), as docs/api.md asks of clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, Protocol
from urllib.parse import quote

import httpx

from suzumio.cli import rest

RESUMABLE = 503
TRANSIENT = frozenset({502, 503, 504})  # before the stream began: a proxy, a gateway restarting
RECONNECTS = 5  # connections in a row that bring no item (an end alone, or nothing)
RECONNECT_SECONDS = 1.0


class Reader(Protocol):
    """What takes the items (`chat.Conversation`)."""

    def take(self, event: str, data: dict[str, Any]) -> None: ...


class StreamRefusedError(Exception):
    """The gateway refused the timeline (or ended it for a reason a reconnect cannot mend)."""


async def read_timeline(
    client: httpx.AsyncClient, session_id: str, cursor: str, reader: Reader
) -> None:
    """Read the session's timeline into `reader`, from `cursor`, resuming from the last
    cursor given when the gateway ends the stream with 503 or the connection drops without
    an end, or a proxy answers 502/503/504 (a gateway restarting): at once after a connection
    that brought items, else a second apart, a few times in a row before it is given up — a
    gateway that ends every stream at once (503: its log unreadable, draining) is not asked
    again and again as fast as it answers."""
    path = f"/v1/sessions/{quote(session_id, safe='')}/stream"
    stream = _Stream(cursor)
    empty = 0  # connections in a row that brought nothing
    while True:
        ended, why = await stream.read(client, path, reader)
        resumable = ended is None or ended.get("status") == RESUMABLE
        if resumable and stream.items:
            empty = 0
            continue
        if resumable and empty < RECONNECTS:
            empty += 1
            await asyncio.sleep(RECONNECT_SECONDS)
            continue
        status = ended.get("status") if ended else "closed"
        raise StreamRefusedError(f"the session's stream ended ({status}): {why}")


class _Stream:
    """One connection to the timeline after another, each from the last cursor given."""

    def __init__(self, cursor: str) -> None:
        self.cursor = cursor
        self.items = 0  # read on the last connection (its end not counted)

    async def read(
        self, client: httpx.AsyncClient, path: str, reader: Reader
    ) -> tuple[dict[str, Any] | None, str]:
        """One connection's items into `reader`: its `end` item (None: there was none), and
        why it ended."""
        self.items = 0
        try:
            async with client.stream("GET", path, params={"since": self.cursor}) as response:
                if response.status_code != 200:
                    await response.aread()
                    refusal = f"{response.status_code}: {detail(response)}"
                    if response.status_code not in TRANSIENT:
                        raise StreamRefusedError(refusal)
                    return None, refusal
                async for event, data, item_id in _items(response):
                    if item_id:
                        self.cursor = item_id
                    if event == "end":
                        return data, str(data.get("detail"))
                    self.items += 1
                    reader.take(event, data)
        except httpx.TransportError as exc:  # refused, reset or cut off mid-stream
            return None, f"{type(exc).__name__}: {exc}"
        return None, "the gateway closed it"


async def _items(response: httpx.Response) -> AsyncIterator[tuple[str, dict[str, Any], str]]:
    """The SSE items of `response`: (event, data as a JSON object, id)."""
    event, data, item_id = "message", "", ""
    async for line in response.aiter_lines():
        if not line:
            if data:
                with contextlib.suppress(ValueError):
                    parsed = json.loads(data)
                    if isinstance(parsed, dict):
                        yield event, parsed, item_id
            event, data, item_id = "message", "", ""
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        match name:
            case "event":
                event = value
            case "data":
                data = f"{data}\n{value}" if data else value
            case "id":
                item_id = value


def detail(response: httpx.Response) -> str:
    body = rest.json_object(response)
    detail = body.get("detail") if body is not None else None
    return str(detail) if detail is not None else rest.short(response)
