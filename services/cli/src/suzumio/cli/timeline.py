"""A session's timeline (`GET /v1/sessions/{id}/stream`, SSE) as the CLI reads it: items of
(event, data, cursor), resumed from the last cursor when the gateway ends the stream with 503
(live output restarted, a slow reader), as docs/api.md asks of clients."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, Protocol
from urllib.parse import quote

import httpx

from suzumio.cli import rest

RESUMABLE = 503


class Reader(Protocol):
    """What takes the items (`chat.Conversation`)."""

    def take(self, event: str, data: dict[str, Any]) -> None: ...


class StreamRefusedError(Exception):
    """The gateway refused the timeline (or ended it for a reason a reconnect cannot mend)."""


async def read_timeline(
    client: httpx.AsyncClient, session_id: str, cursor: str, reader: Reader
) -> None:
    """Read the session's timeline into `reader`, from `cursor`, resuming from the last
    cursor given when the gateway ends the stream with 503."""
    path = f"/v1/sessions/{quote(session_id, safe='')}/stream"
    while True:
        async with client.stream("GET", path, params={"since": cursor}) as response:
            if response.status_code != 200:
                await response.aread()
                raise StreamRefusedError(f"{response.status_code}: {detail(response)}")
            ended: dict[str, Any] | None = None
            async for event, data, item_id in _items(response):
                if item_id:
                    cursor = item_id
                if event == "end":
                    ended = data
                    break
                reader.take(event, data)
        if ended is None or ended.get("status") != RESUMABLE:
            why = ended.get("detail") if ended else "the gateway closed it"
            status = ended.get("status") if ended else "closed"
            raise StreamRefusedError(f"the session's stream ended ({status}): {why}")


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
