"""The HTTP side: an OpenAI-compatible server on the test's event loop that plays a script.

Starlette routes behind an in-process uvicorn server that leaves the process's signal handlers
alone. Every request is recorded before it is answered, so a test can wait for a request that
is still being delayed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from suzumio.testing.inprocess import InProcessServer
from suzumio.testing.model.demo import DemoModel
from suzumio.testing.model.replies import Reply, error_body
from suzumio.testing.model.script import Script, Step, resolve, script_exhausted
from suzumio.testing.model.script_file import load_script
from suzumio.testing.model.wire import Answer, completion_json, sse, stream_json

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server received it."""

    method: str
    path: str
    headers: Mapping[str, str]
    """Lower-cased names, e.g. `headers["authorization"] == "Bearer test"`."""
    body: Any
    """The parsed JSON body; None when there was none or it was not JSON."""
    received_at: float
    """`time.monotonic()` on arrival."""

    @property
    def json(self) -> dict[str, Any]:
        return self.body if isinstance(self.body, dict) else {}

    @property
    def model(self) -> str | None:
        model = self.json.get("model")
        return model if isinstance(model, str) else None

    @property
    def stream(self) -> bool:
        return bool(self.json.get("stream"))

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.json.get("messages") or [])

    @property
    def tool_names(self) -> list[str]:
        return [t.get("function", {}).get("name") for t in self.json.get("tools") or []]


class DroppedConnectionError(Exception):
    """Raised inside a stream to make uvicorn drop the connection (`disconnect_after`)."""


class _HideDroppedConnections(logging.Filter):
    """Keeps uvicorn from logging a traceback for every connection a script drops on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], DroppedConnectionError))


_HIDE_DROPPED = _HideDroppedConnections()


class ScriptedModelServer:
    """An OpenAI-compatible chat-completions server that plays scripted steps.

    Args:
        host: the address to bind.
        port: the port; 0 picks a free one.
        default: the step used when a queue is empty (default: a 500 "script exhausted").
        models: extra names listed by `GET /v1/models`.

    Example:
        async with ScriptedModelServer() as server:
            server.script([Reply.text("hi")], model="primary")
            client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="test")
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        default: Step = script_exhausted,
        models: Sequence[str] = (),
    ) -> None:
        self.host = host
        self.port = port
        self.requests: list[RecordedRequest] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        """The most chat-completion requests being answered at once."""
        self._script = Script(default)
        self._models = list(models)
        self._arrived = asyncio.Condition()
        self._http = InProcessServer(self._count_in_flight, host, port)
        self._closing = self._http.closing
        self.app = self._build_app()

    @property
    def url(self) -> str:
        """`http://host:port`, without `/v1`; valid once started."""
        if not self._http.serving:
            raise RuntimeError("the model server is not started")
        return f"http://{self.host}:{self.port}"

    @property
    def default(self) -> Step:
        return self._script.default

    @default.setter
    def default(self, step: Step) -> None:
        self._script.default = step

    def script(self, steps: Iterable[Step], *, model: str | None = None) -> None:
        """Queue steps, one per request: for requests naming `model`, or shared when None.

        A model with a queue of its own never takes shared steps. Calls append.
        """
        self._script.add(steps, model)

    def load_script(self, path: Path) -> None:
        """Queue the steps of a JSON script file (format: `model.script_file`)."""
        load_script(path).apply_to(self._script)

    def pending(self, model: str | None = None) -> int:
        """Steps not yet played in the shared queue, or in `model`'s own queue."""
        return self._script.pending(model)

    @property
    def completion_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path in CHAT_PATHS]

    async def wait_for_requests(self, count: int, timeout: float = 5.0) -> list[RecordedRequest]:
        """The first `count` requests, once that many have arrived (TimeoutError otherwise)."""
        try:
            async with asyncio.timeout(timeout), self._arrived:
                await self._arrived.wait_for(lambda: len(self.requests) >= count)
        except TimeoutError:
            raise TimeoutError(
                f"expected {count} requests within {timeout}s, got {len(self.requests)}"
            ) from None
        return self.requests[:count]

    async def start(self) -> Self:
        logging.getLogger("uvicorn.error").addFilter(_HIDE_DROPPED)
        self.port = await self._http.start("model server")
        return self

    async def close(self) -> None:
        """Stop: delayed answers are cut short, open connections are closed."""
        await self._http.stop()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _build_app(self) -> Starlette:
        routes = [Route(path, self._chat, methods=["POST"]) for path in CHAT_PATHS]
        routes += [Route(path, self._list_models, methods=["GET"]) for path in ("/v1/models",)]
        routes.append(Route("/{rest:path}", self._unknown, methods=["GET", "POST", "PUT"]))
        return Starlette(routes=routes)

    async def _count_in_flight(self, scope: Scope, receive: Receive, send: Send) -> None:
        counted = scope["type"] == "http" and scope["path"] in CHAT_PATHS
        if counted:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            await self.app(scope, receive, send)
        finally:
            if counted:
                self.in_flight -= 1

    async def _record(self, request: Request) -> tuple[RecordedRequest, int]:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        recorded = RecordedRequest(
            method=request.method,
            path=request.url.path,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
            received_at=time.monotonic(),
        )
        self.requests.append(recorded)
        number = len(self.requests)
        async with self._arrived:
            self._arrived.notify_all()
        return recorded, number

    async def _chat(self, request: Request) -> Response:
        recorded, number = await self._record(request)
        if not isinstance(recorded.body, dict):
            message = "We could not parse the JSON body of your request: expected a JSON object."
            return _error_response(Reply.error(400, _invalid(message)))
        # Taken before any await, so concurrent requests consume steps in arrival order.
        step = self._script.next_step(recorded.model)
        reply = await resolve(step, recorded.body)
        await self._pause(reply.delay)
        if reply.is_error:
            return _error_response(reply)
        answer = Answer.build(reply, recorded.body, number, int(time.time()))
        if not recorded.stream:
            return JSONResponse(completion_json(answer), headers=dict(reply.headers))
        options = recorded.json.get("stream_options") or {}
        chunks = stream_json(answer, include_usage=bool(options.get("include_usage")))
        return StreamingResponse(
            self._stream(chunks, reply),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", **reply.headers},
        )

    async def _stream(self, chunks: list[dict[str, Any]], reply: Reply) -> AsyncIterator[bytes]:
        for index, chunk in enumerate(chunks):
            if index == reply.disconnect_after:
                raise DroppedConnectionError
            if index == reply.end_after:
                return
            if index and reply.chunk_delay:
                await self._pause(reply.chunk_delay)
            yield sse(chunk)
        if reply.disconnect_after is not None:
            raise DroppedConnectionError
        if reply.end_after is None:
            yield sse("[DONE]")

    async def _pause(self, seconds: float) -> None:
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), seconds)

    async def _list_models(self, request: Request) -> Response:
        await self._record(request)
        names = {*self._models, *self._script.models()}
        if isinstance(self._script.default, DemoModel):
            names.add(DemoModel.name)
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "suzumio"} for n in names]
        return JSONResponse({"object": "list", "data": sorted(data, key=lambda m: m["id"])})

    async def _unknown(self, request: Request) -> Response:
        await self._record(request)
        message = f"Unknown request URL: {request.method} {request.url.path}."
        return _error_response(Reply.error(404, _invalid(message, code="unknown_url")))


def _invalid(message: str, code: str | None = None) -> dict[str, Any]:
    return error_body(message, type_="invalid_request_error", code=code)


def _error_response(reply: Reply) -> Response:
    headers = dict(reply.headers)
    if isinstance(reply.body, bytes):  # as it is (compressed, say: with its header)
        return Response(reply.body, status_code=reply.status, headers=headers)
    if isinstance(reply.body, str):
        return PlainTextResponse(reply.body, status_code=reply.status, headers=headers)
    return JSONResponse(reply.body, status_code=reply.status, headers=headers)
