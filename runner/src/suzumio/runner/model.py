"""Model calls through the official `openai` SDK, for any OpenAI-compatible endpoint.

Where a model lives comes from the sandbox's environment (the orchestrator puts the agent's
provider settings there; a key passes through the broker only when the provider refused the
environment's and the loop asks for the one the project holds now, `ModelClient.use_key`):

- `SUZUMIO_MODEL_BASE_URL` / `SUZUMIO_MODEL_API_KEY` for models without a provider id
  (falling back to `OPENAI_BASE_URL` / `OPENAI_API_KEY`);
- `SUZUMIO_PROVIDER_<ID>_BASE_URL` / `SUZUMIO_PROVIDER_<ID>_API_KEY` for a model whose spec names
  provider `<id>` (upper-cased, other characters than letters and digits as `_`).

Responses are streamed; text deltas go to `on_text` as they arrive.

The request goes through the SDK's generic `post` (its documented way to send a body as is):
`chat.completions.create` first walks the whole body through its type-driven transformation,
which for messages and tool schemas that are plain JSON already changes nothing and costs
every call milliseconds of CPU (more with every tool schema). The stream's chunks are read as
the JSON they are (`AsyncStream[object]`), not built into the SDK's response models: building
a model per chunk was a quarter of a call's CPU, for the few fields read here. Errors (an
error event mid-stream too), the SSE parsing and the connection handling are the SDK's.

The body goes as bytes (`content`), which the SDK sends as they are: made by orjson, the
same compact UTF-8 JSON as the SDK's own `json.dumps` makes (its separators,
`ensure_ascii=False`) in a twentieth of the time — the tool schemas are most of a body, and
its encoding was 6% of a resident runner's CPU. What orjson cannot encode (an integer past 64
bits, a key that is not a string) goes to the SDK as before. Two differences, both in tool
schemas a toolpack built in Python: a non-finite number goes as `null` (the SDK refused the
call), and a UUID, date or enum as its JSON text (the SDK refused those too).

A stream that ends with neither a `finish_reason` nor `[DONE]` was cut off, not finished (an
upstream that failed mid-reply behind a proxy that closed the response cleanly): it fails
the call as a transport failure, which the loop retries, instead of taking the part that came
for the whole answer. A stream with either one is whole (some servers send `[DONE]` without
a reason, or a reason without `[DONE]`).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import openai
import orjson
from openai._httpx2 import request_exceptions, timeout_exceptions
from openai._streaming import ServerSentEvent

from suzumio.contracts.values import ModelSpec
from suzumio.runner.connections import Connections, model_http, sdk_client

Message = dict[str, Any]
# A reply is read up to these bounds, then taken as cut off by the output cap (`length`): a
# provider that ignores `max_tokens`, or streams for ever, must not grow the runner's memory
# until the wall-clock limit or the OOM killer ends it.
MAX_TEXT_CHARS = 1_000_000  # what a history entry holds
MAX_CALL_CHARS = 40_000_000  # ids, names and arguments (file.write: 32 M, JSON-escaped)
CALL_OVERHEAD_CHARS = 100  # counted per call, so a stream of empty calls is bounded too
# One SSE event, as bytes: a provider that sends a call's whole arguments in one chunk sends
# at most the 40 M above, JSON-escaped.
MAX_EVENT_BYTES = 256 << 20
DONE_READ_SECONDS = 0.1  # as long as the SDK's drain waits for the rest


class StreamCutShortError(ConnectionError):
    """The model's stream ended before its reply did: a transport failure, retried."""


class StreamEventTooLargeError(StreamCutShortError):
    """One event of the model's stream grew past `MAX_EVENT_BYTES` before it ended."""


class _Stream(openai.AsyncStream[object]):
    """The SDK's stream of JSON chunks, noting whether `[DONE]` came (the SDK swallows it),
    and bounding each event: the SDK's decoder keeps a line, and an event's lines, however
    long they grow, and a provider (or a proxy) streaming one endless `data:` line, or lines
    with no blank line between them, parses into no chunk for the reply's bounds to count —
    only the idle timeout (600 s, reset by nothing) ended it, gigabytes later."""

    done = False

    async def _iter_events(self) -> AsyncIterator[ServerSentEvent]:
        since_event = 0  # the bytes read since the decoder last gave an event

        async def counted(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
            nonlocal since_event
            async for chunk in chunks:
                since_event += len(chunk)
                if since_event > MAX_EVENT_BYTES:
                    raise StreamEventTooLargeError(
                        f"an event of the model's stream passed {MAX_EVENT_BYTES} bytes"
                    )
                yield chunk

        try:
            events = self._decoder.aiter_bytes(counted(self.response.aiter_bytes()))
            async for sse in events:
                since_event = 0
                if sse.data.startswith("[DONE]"):
                    self.done = True
                    if self.response.http_version == "HTTP/1.1":  # as the SDK drains it
                        await _read_out(events)
                yield sse
        except timeout_exceptions() as err:  # as the SDK's own reading maps them
            raise openai.APITimeoutError(request=self.response.request) from err
        except request_exceptions() as err:
            raise openai.APIConnectionError(request=self.response.request) from err


async def _read_out(events: AsyncIterator[ServerSentEvent]) -> None:
    """The rest of a stream after its `[DONE]` (its body's end, as a rule), read for a moment:
    the response is then whole and closed, and the SDK's own drain of it, under anyio's
    cancel scopes, is skipped (~50 µs of a ~1 ms activation). What is still not read after
    `DONE_READ_SECONDS` is left to that drain, and a failure reading it changes nothing: the
    reply came whole."""
    with contextlib.suppress(Exception):  # a timeout, a connection reset after the end, …
        async with asyncio.timeout(DONE_READ_SECONDS):
            async for _ in events:  # nothing is expected after [DONE]: dropped, as the SDK does
                pass


@dataclass(frozen=True)
class Endpoint:
    base_url: str | None
    api_key: str
    provider: str | None = None
    """The project's provider whose settings these are (its key can be refreshed through the
    broker); None for the platform's default endpoint."""


@dataclass(frozen=True)
class WireCall:
    id: str
    name: str  # the wire name (`file_read`)
    arguments: str


@dataclass
class ModelTurn:
    model: str
    text: str = ""
    tool_calls: list[WireCall] = field(default_factory=list)
    finish_reason: str = "stop"
    usage: dict[str, int] = field(default_factory=dict)


def relayed_endpoint(spec: ModelSpec, broker_url: str, token: str) -> Endpoint:
    """The broker's model relay for `spec` (network `none`: the sandbox reaches nothing else),
    the activation's token as the key. No provider to refresh a key of: the broker calls the
    provider with the key its project holds now."""
    relay = f"{broker_url.rstrip('/')}/runner/models/"
    if spec.provider is None:
        return Endpoint(relay + "default", token)
    return Endpoint(relay + "providers/" + quote(spec.provider, safe=""), token)


def endpoint_for(spec: ModelSpec, env: Mapping[str, str]) -> Endpoint:
    if spec.provider:
        key = re.sub(r"[^A-Z0-9]", "_", spec.provider.upper())
        prefix = f"SUZUMIO_PROVIDER_{key}_"
        if f"{prefix}BASE_URL" in env or f"{prefix}API_KEY" in env:
            return Endpoint(
                env.get(f"{prefix}BASE_URL"), env.get(f"{prefix}API_KEY", "none"), spec.provider
            )
    base = env.get("SUZUMIO_MODEL_BASE_URL") or env.get("OPENAI_BASE_URL")
    key = env.get("SUZUMIO_MODEL_API_KEY") or env.get("OPENAI_API_KEY") or "none"
    return Endpoint(base, key)


class ModelClient:
    """One model of the chain, on the SDK's client of its endpoint (`sdk_client`: the SDK's
    own retries off, the loop decides)."""

    def __init__(
        self,
        spec: ModelSpec,
        endpoint: Endpoint,
        timeout: float = 600.0,
        kept: Connections | None = None,
        socket: str | None = None,
    ) -> None:
        """`kept`: a resident runner's clients (`Connections`), which `close` leaves open;
        without them, the model gets a client of its own (through the broker's Unix socket,
        with `socket`)."""
        self.spec = spec
        self.provider = endpoint.provider
        self.api_key = endpoint.api_key
        self.base_url = endpoint.base_url
        self._timeout = timeout
        self._owns_client = kept is None
        if kept is None or socket is not None:
            self._owns_client = True
            self._http = model_http(socket=socket)
            self._client = sdk_client(endpoint.base_url, endpoint.api_key, timeout, self._http)
        else:
            self._http = kept.model()
            self._client = kept.sdk(endpoint.base_url, endpoint.api_key, timeout)

    def use_key(self, api_key: str) -> None:
        """Call with `api_key` from now on (a refreshed credential), on the same connections.
        A resident runner's kept clients are not given it: they serve the environment's key,
        and this one is the activation's alone."""
        self.api_key = api_key
        self._client = sdk_client(self.base_url, api_key, self._timeout, self._http)

    async def close(self) -> None:
        if self._owns_client:
            await self._http.aclose()  # every client it had shares it

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        max_tokens: int,
        on_text: Callable[[str], None] | None = None,
    ) -> ModelTurn:
        body: dict[str, Any] = {
            "model": self.spec.name,
            "messages": list(messages),
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        } | ({"tools": list(tools)} if tools else {})
        encoded = _encoded(body)
        stream = await self._client.post(
            "/chat/completions",
            **({"content": encoded} if isinstance(encoded, bytes) else {"body": body}),
            cast_to=object,
            stream=True,
            stream_cls=_Stream,
            options={"security": {"bearer_auth": True}},  # as `create` asks: the API key only
        )
        turn = _Assembly(self.spec.name, on_text)
        # The read timeout is per read: a gateway's keep-alive comments (`: PROCESSING`) reset
        # it, and an upstream that hung held the call for the activation's whole wall clock,
        # no retry, no fallback. As long again with no chunk at all ends the call (a
        # TimeoutError: a transport failure, retried).
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._timeout) as idle:
                async for chunk in stream:
                    idle.reschedule(loop.time() + self._timeout)
                    turn.add(_an_object(chunk, stream))
                    if turn.full:
                        await stream.close()  # the rest is not read: the connection goes
                        break
        except Exception:  # the idle timeout, a bound, a chunk refused: the connection goes
            with contextlib.suppress(Exception):
                await stream.close()
            raise
        if not (turn.full or turn.finished or stream.done):
            raise StreamCutShortError(
                "the model's stream ended before its reply did (no finish_reason, no [DONE])"
            )
        return turn.done()


def _an_object(chunk: object, stream: _Stream) -> dict[str, Any]:
    if not isinstance(chunk, dict):
        raise openai.APIResponseValidationError(
            response=stream.response, body=chunk, message="a chunk is not an object"
        )
    return chunk


def _encoded(body: dict[str, Any]) -> bytes | dict[str, Any]:
    """The body as JSON bytes; itself if orjson refuses it (the SDK encodes it then)."""
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError:
        return body


class _Assembly:
    """A turn put together from its stream's chunks, read as JSON."""

    def __init__(self, model: str, on_text: Callable[[str], None] | None) -> None:
        self.turn = ModelTurn(model=model)
        self._on_text = on_text
        self._text: list[str] = []
        self._calls: dict[int, dict[str, str]] = {}  # by the order calls first appeared
        self._by_index: dict[int, int] = {}  # the provider's index -> the slot it fills now
        self._by_id: dict[str, int] = {}  # a call's id -> its slot (streams without an index)
        # Each call's argument pieces, joined once at the end: added to a string piece by
        # piece, an 800 KB argument streamed in small deltas took seconds of CPU.
        self._arguments: dict[int, list[str]] = {}
        self._text_left = MAX_TEXT_CHARS
        self._call_left = MAX_CALL_CHARS
        self.full = False
        """A bound was reached: the reply ends here, as one cut off by the output cap."""
        self.finished = False
        """A choice brought its `finish_reason`: the reply is whole."""

    def add(self, chunk: dict[str, Any]) -> None:
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.turn.usage = {
                k: int(v) if isinstance(v := usage.get(k), int | float) else 0
                for k in ("prompt_tokens", "completion_tokens", "total_tokens")
            }
        for choice in _objects(chunk.get("choices")):
            delta = choice.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            content = self._take_text(_text(delta.get("content")))
            if content:
                self._text.append(content)
                if self._on_text is not None:
                    self._on_text(content)
            for tc in _objects(delta.get("tool_calls")):
                self._add_call(tc)
            reason = _text(choice.get("finish_reason"))
            if reason:
                self.turn.finish_reason = reason
                self.finished = True
        if self.full:
            self.turn.finish_reason = "length"

    def _take_text(self, text: str) -> str:
        if len(text) > self._text_left:
            text, self.full = text[: self._text_left], True
        self._text_left -= len(text)
        return text

    def _take_call(self, text: str) -> str:
        if len(text) > self._call_left:
            text, self.full = text[: self._call_left], True
        self._call_left -= len(text)
        return text

    def _add_call(self, tc: dict[str, Any]) -> None:
        call_id = _text(tc.get("id"))
        index = tc.get("index")
        function = tc.get("function")
        name = _text(function.get("name")) if isinstance(function, dict) else ""
        named = bool(name)
        key: int | None
        if not isinstance(index, int):  # a provider that leaves it out
            key = self._unindexed(call_id, name)
        else:
            key = self._by_index.get(index)
            known = self._calls[key]["id"] if key is not None else ""
            if call_id and known and call_id != known and named:
                # Another call under an index already used: Ollama and some vLLM builds stream
                # every parallel call at index 0, each with its own id (and name). Joined,
                # their names and arguments made one call nobody made, and the others were
                # lost. Only a named one: some servers send a fresh id with each later chunk
                # of the same call.
                key = None
            if key is None:
                key = self._open()
                if key is not None:
                    self._by_index[index] = key
        if key is None:
            return
        slot, pieces = self._calls[key], self._arguments[key]
        if call_id and not slot["id"]:  # the first: later chunks may bring fresh ones
            slot["id"] = self._take_call(call_id)
            self._by_id[call_id] = key  # the newest call under it: its later chunks follow
        if isinstance(function, dict):
            if name != slot["name"]:  # a server that repeats the name with every chunk
                slot["name"] += self._take_call(name)
            pieces.append(self._take_call(_text(function.get("arguments"))))

    def _unindexed(self, call_id: str, name: str) -> int | None:
        """The slot of a delta without an index: the call whose id it repeats; else a new
        call when it is the first, or brings a new id and a name; else the call it follows
        (a fresh id with each chunk, as some servers send). A delta with an id was taken for
        a new call before: a stream repeating its call's id with every chunk was split into
        a call and nameless fragments of its arguments."""
        known = self._by_id.get(call_id) if call_id else None
        if known is not None:
            return known
        if not self._calls or (call_id and name):
            return self._open()
        return max(self._calls)

    def _open(self) -> int | None:
        """A new call's slot (in the order calls first appear), or None once the bound is
        reached."""
        if self._call_left < CALL_OVERHEAD_CHARS:
            self.full = True
            return None
        self._call_left -= CALL_OVERHEAD_CHARS
        key = len(self._calls)
        self._calls[key] = {"id": "", "name": ""}
        self._arguments[key] = []
        return key

    def done(self) -> ModelTurn:
        self.turn.text = "".join(self._text)
        self.turn.tool_calls = [
            WireCall(c["id"] or f"call_{i}", c["name"], "".join(self._arguments[i]))
            for i, c in sorted(self._calls.items())
        ]
        return self.turn


def _objects(value: object) -> list[dict[str, Any]]:
    """The JSON objects of a list in a chunk (anything else in it is not ours to read)."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
