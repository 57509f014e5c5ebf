"""A session's live timeline: Server-Sent Events, or a WebSocket for clients that prefer it.

Events are the session's log entries (`event:` is the event type, `data:` the envelope) and
its live output (`event: live`, `data:` a LiveChunk). Items carry an id `E.L` (events stored
together: on the last one only); send the last one back as `Last-Event-ID` (SSE does so by
itself) to resume without gaps — a commit cut off midway comes again whole, so clients tell
events apart by their envelope id.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import Role
from suzumio.gateway.api.deps import (
    GatewayDep,
    PrincipalDep,
    authenticate,
    presented_key,
    still_allowed,
)
from suzumio.gateway.api.problems import ApiError
from suzumio.gateway.api.routes.common import RESPONSES
from suzumio.gateway.api.routes.sessions import visible_session
from suzumio.gateway.feed import Cursor, Recheck, SessionFeed
from suzumio.gateway.state import Gateway
from suzumio.platform.logging import get_logger

log = get_logger(__name__)

router = APIRouter(tags=["sessions"], responses=RESPONSES)


@router.get(
    "/v1/sessions/{session_id}/stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "the timeline"}},
)
async def stream(
    session_id: Identifier,
    request: Request,
    gw: GatewayDep,
    who: PrincipalDep,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=50)] = None,
    since: Annotated[
        str | None, Query(max_length=50, description="a cursor, like Last-Event-ID")
    ] = None,
) -> StreamingResponse:
    """The session's timeline from its beginning (or from `Last-Event-ID`), then live. The
    stream ends with an `end` event when the key is revoked or access is withdrawn."""
    await visible_session(gw, who, session_id, Role.VIEWER)
    recheck = _rechecker(gw, presented_key(request.headers), session_id)
    feed = SessionFeed(
        gw,
        session_id,
        Cursor.parse(last_event_id or since),
        recheck,
        gw.settings.stream_recheck_seconds,
    )
    release = _take_stream(gw, who.user_id)
    try:
        await feed.open()
    except BaseException:
        release()
        raise

    async def body() -> AsyncIterator[bytes]:
        try:
            yield b"retry: 2000\n\n"
            # No per-item disconnect poll: the response's own disconnect listener cancels
            # this generator, and a client that stops reading is let go (`_FeedResponse`).
            async for item in feed.items():
                if item is None:
                    yield b": keepalive\n\n"
                    continue
                cursor = f"id: {item.cursor}\n" if item.cursor else ""
                yield (
                    f"{cursor}event: {item.event}\ndata: ".encode()
                    + item.data.replace(b"\n", b"\ndata: ")
                    + b"\n\n"
                )
        finally:
            release()
            await feed.close()

    async def ended() -> None:
        release()
        await feed.close()

    return _FeedResponse(
        body(),
        ended,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        write_seconds=gw.settings.stream_write_timeout_seconds,
    )


class _StalledError(Exception):
    """The client took none of a write's bytes within the write timeout."""


async def _within(seconds: float, write: Awaitable[None]) -> None:
    """The write, given up as stalled after `seconds`: a server's write waits for room in the
    socket with no end of its own."""
    try:
        async with asyncio.timeout(seconds):
            await write
    except TimeoutError:
        raise _StalledError from None


class _FeedResponse(StreamingResponse):
    """A stream whose feed is closed however the response ends: a body that never started
    (the client gone before its first byte) runs no `finally` of its own. A client that
    keeps its connection open and reads nothing is let go after `write_seconds` on one
    write: the server's write waits for room in the socket with no end of its own, and held
    the feed, its queues and consumer, and the user's stream slot for as long."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        ended: Callable[[], Awaitable[None]],
        *,
        media_type: str,
        headers: dict[str, str],
        write_seconds: float,
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self._ended = ended
        self._write_seconds = write_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_within(message: Message) -> None:
            await _within(self._write_seconds, send(message))

        try:
            await super().__call__(scope, receive, send_within)
        except* _StalledError:
            log.info("stream.client_stalled", seconds=self._write_seconds)
        finally:
            await self._ended()


@router.websocket("/v1/sessions/{session_id}/ws")
async def stream_ws(
    websocket: WebSocket,
    session_id: Identifier,
    access_token: Annotated[str | None, Query(max_length=500)] = None,
    last_event_id: Annotated[str | None, Query(max_length=50)] = None,
    since: Annotated[
        str | None, Query(max_length=50, description="a cursor, like Last-Event-ID")
    ] = None,
) -> None:
    """The same timeline over a WebSocket: one JSON message `{id, event, data}` per item.
    Authenticate with `Authorization: Bearer` or `?access_token=` (browsers cannot set
    headers on WebSockets); resume from a cursor given as the SSE stream takes it
    (`Last-Event-ID`, `?since=`) or `?last_event_id=`."""
    gw = websocket.app.state.gateway
    key = presented_key(websocket.headers, access_token)
    release: Callable[[], None] | None = None
    try:
        who = await authenticate(gw, key)
        await visible_session(gw, who, session_id, Role.VIEWER)
        # As the SSE stream takes it too: a cursor given otherwise, ignored, replayed the
        # whole timeline and lost the live output since the cursor.
        header = websocket.headers.get("last-event-id")
        cursor = Cursor.parse(last_event_id or since or header)
        recheck = _rechecker(gw, key, session_id)
        feed = SessionFeed(gw, session_id, cursor, recheck, gw.settings.stream_recheck_seconds)
        release = _take_stream(gw, who.user_id)
        await feed.open()  # refuses a cursor past the log's end (and closes itself then)
    except BaseException as exc:
        if release is not None:
            release()
        if not isinstance(exc, ApiError):
            raise
        # Accepted first, so the client learns why (4401, 4404, 4422, 4429).
        await websocket.accept()
        await websocket.close(code=4000 + exc.status, reason=exc.detail[:120])
        return
    seconds = gw.settings.stream_write_timeout_seconds
    try:
        await websocket.accept()  # in here: a client gone by now leaves no feed open
        async for item in feed.items():
            if item is None:
                await _within(seconds, websocket.send_json({"event": "keepalive"}))
                continue
            data = json.loads(item.data)
            message = json.dumps({"id": item.cursor, "event": item.event, "data": data})
            await _within(seconds, websocket.send_text(message))
            if item.event == "end":
                status, reason = 4000 + int(data["status"]), data["detail"][:120]
                await _within(seconds, websocket.close(code=status, reason=reason))
                return
    except WebSocketDisconnect:
        pass
    except _StalledError:
        # As the SSE stream's: a client that keeps its socket open and reads nothing held
        # the feed, its queues and consumer, and the user's stream slot for good (uvicorn's
        # keepalive ping gives up on it, but its close waits for the unread bytes too).
        log.info("stream.client_stalled", seconds=seconds, transport="websocket")
    finally:
        release()
        await feed.close()


def _take_stream(gw: Gateway, user_id: str) -> Callable[[], None]:
    """One more open stream of the user's on this replica (429 past the limit: one client
    opening streams in a loop, or many tabs, cannot hold the gateway's memory and the
    server's consumers from everyone else); what gives it back, once."""
    limit = gw.settings.stream_max_per_user
    if gw.open_streams.held(user_id) >= limit:
        raise ApiError(
            429,
            f"at most {limit} streams open at once per user; close one first",
            headers={"Retry-After": "5"},
        )
    return gw.open_streams.take(user_id)


def _rechecker(gw: Gateway, key: str | None, session_id: str) -> Recheck:
    async def recheck() -> None:
        who = await still_allowed(gw, key)
        await visible_session(gw, who, session_id, Role.VIEWER)

    return recheck
