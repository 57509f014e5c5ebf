"""The runner's side of the tool-broker API (DESIGN.md §7): typed calls with bounded retries.

Transport errors and 5xx answers are retried, honouring Retry-After (every call is idempotent
on the broker's side); when the retries run out, `BrokerUnavailableError`: the platform was in
trouble and nothing was refused (a refusal, the broker's verdict, is a 4xx: `BrokerError`).
401/403 mean the activation may no longer act (expired, cancelled, replaced): `FencedError` is
raised and the loop stops at once without touching anything else.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import random
import re
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, BinaryIO, TypeVar

import httpx
import orjson
from pydantic import BaseModel, ValidationError

from suzumio.contracts.broker import (
    MAX_RECEIVED,
    AskOutcome,
    AskRequest,
    CheckpointPut,
    CompactionMarker,
    CredentialAnswer,
    CredentialRequest,
    FinalCall,
    HistoryAppend,
    HistoryEntryIn,
    Recorded,
    SignalsTake,
    SignalsTaken,
    StreamBatch,
    StreamChunk,
    SupportCall,
    SupportResult,
    ToolCallFinish,
    ToolCallStart,
)
from suzumio.contracts.runner import (
    CheckpointRef,
    FileRef,
    InputFile,
    RunnerActivationOutput,
    SignalSpec,
)
from suzumio.contracts.values import ModelSpec
from suzumio.runner.connections import broker_http
from suzumio.runner.log import log

M = TypeVar("M", bound=BaseModel)
MAX_BATCH_ENTRIES = 200
MAX_BATCH_CHARS = 2_000_000  # well under the bus's message size
FILE_CHUNK = 256 * 1024
# Ids a query string carries within an h11 server's 16 KB request head (with the headers).
MAX_RECEIVED_IN_URL = 300
MAX_RETRY_AFTER = 10.0
# The output is the one call whose loss costs the whole activation: a broker that answers it
# with 5xx is waited for longer (about a minute) than for the others.
OUTPUT_RETRIES = 14
# One that cannot be reached is tried as often as before runtime profiles set the tries
# (`loop.broker_retries`), however few they ask for: it may be gone, not merely in trouble.
OUTPUT_UNREACHED_RETRIES = 5
# W3C trace context (version 00; ids not all zeros): the launch's, which the orchestrator puts
# in the sandbox's `TRACEPARENT`; every call to the broker carries it, so the broker's spans
# of this activation are in the trace of what asked for it. The runner makes no spans itself:
# a sandbox has no collector to send them to.
_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


def traceparent(env: Mapping[str, str]) -> dict[str, str]:
    """The `traceparent` header the environment's `TRACEPARENT` makes, if it is a valid one."""
    value = env.get("TRACEPARENT", "").strip().lower()
    return {"traceparent": value} if _TRACEPARENT.fullmatch(value) else {}


def json_size(text: str) -> int:
    """The bytes `text` takes as a JSON string (its escapes included)."""
    try:
        return len(orjson.dumps(text))
    except orjson.JSONEncodeError:  # a lone surrogate: escaped, as the bus's encoder would
        return len(json.dumps(text))


def _batches(entries: Sequence[HistoryEntryIn]) -> Iterator[tuple[HistoryEntryIn, ...]]:
    batch: list[HistoryEntryIn] = []
    size = 0
    for entry in entries:
        # As the JSON the bus carries (bytes, escapes): a batch counted in characters, of
        # 4-byte characters or quote-heavy arguments, could pass the bus's message size.
        entry_size = json_size(entry.text) + sum(json_size(c.arguments) for c in entry.tool_calls)
        if batch and (len(batch) >= MAX_BATCH_ENTRIES or size + entry_size > MAX_BATCH_CHARS):
            yield tuple(batch)
            batch, size = [], 0
        batch.append(entry)
        size += entry_size
    if batch:
        yield tuple(batch)


class BrokerError(Exception):
    """The broker refused a request (a 4xx; 401/403 are `FencedError`), with its problem
    detail. Never a 5xx: those are `BrokerUnavailableError`."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail


class FencedError(BrokerError):
    """The token no longer works: the activation was cancelled, replaced or has expired."""


class OutputChangedError(OSError):
    """An output file ended before the size it was sent under (something changed it)."""


class BrokerUnavailableError(Exception):
    """The broker could not be reached, or answered only 5xx, after the retries: nothing is
    known to have been refused, so the activation's work must not be given up as if it were
    (the orchestrator fails the attempt and may run it again)."""


class BrokerClient:
    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        retries: int = 5,
        output_retries: int = OUTPUT_RETRIES,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        """`http`: a client for `base_url` kept by a resident runner (`Connections`), which
        `aclose` leaves open; the token goes with each request either way. `retries`: of each
        call; `output_retries`: of the activation's output, which rides out longer outages."""
        self._owns_http = http is None
        self._http = http or broker_http(base_url, timeout, transport)
        # What every request carries: the token, and the trace it belongs to. Read when the
        # client is made, for its activation (a resident runner's environment is that of
        # the activation it runs).
        self._auth = {"Authorization": f"Bearer {token}", **traceparent(os.environ)}
        self._retries = retries
        self._output_retries = output_retries
        # Whatever the profile's `broker_retries` (even 0), the output rides out a moment
        # without a broker: its loss costs the whole activation.
        self._output_unreached = max(retries, OUTPUT_UNREACHED_RETRIES)

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        body: BaseModel | None,
        answer: type[M] | None,
        *,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
        retries: int | None = None,
        unreached: int | None = None,
    ) -> M | None:
        content = body.model_dump_json().encode() if body is not None else None
        headers = self._auth
        if content is not None:
            headers = {**self._auth, "Content-Type": "application/json"}
        response = await self._send(
            method, path, lambda: content, headers, params=params, timeout=timeout,
            retries=retries, unreached=unreached,
        )  # fmt: skip
        return self._answer(response, answer)

    async def _send(
        self,
        method: str,
        path: str,
        content: Callable[[], bytes | AsyncIterator[bytes] | None],
        headers: dict[str, str],
        *,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
        retries: int | None = None,
        unreached: int | None = None,
    ) -> httpx.Response:
        """The broker's answer (below 500), retrying transport errors (`unreached` times,
        else `self._retries`) and 5xx answers (`retries` times, else `self._retries`: a
        broker that answers is alive, and its trouble — NATS or Postgres gone for a moment —
        may take longer to pass); `content` makes the body afresh for each try.

        Raises:
            BrokerUnavailableError: no answer below 500 after the retries. A 5xx is the
                platform in trouble, never a verdict on the request: the caller must not
                take it for a refusal.
        """
        answered_retries = self._retries if retries is None else retries
        unreached_retries = self._retries if unreached is None else unreached
        missed = answered = 0
        while True:
            try:
                response = await self._http.request(
                    method,
                    path,
                    content=content(),
                    headers=headers,
                    params=params,
                    timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                )
            except httpx.TransportError:
                await self._pause(missed, f"{method} {path}", unreached_retries)
                missed += 1
                continue
            if response.status_code >= 500:
                what = f"{method} {path}: {response.status_code} {_detail(response)}"
                await self._pause(answered, what, answered_retries, _retry_after(response))
                answered += 1
                continue
            return response

    async def _pause(
        self, attempt: int, what: str, retries: int | None = None, floor: float = 0.0
    ) -> None:
        """Back off before another try (at least `floor` seconds, the broker's Retry-After,
        within reason), or give up after the last."""
        if attempt == (self._retries if retries is None else retries):
            raise BrokerUnavailableError(f"{what}: broker unavailable")
        backoff = min(0.2 * 2**attempt, 5.0) * (1 + random.random() / 2)
        await asyncio.sleep(max(backoff, min(floor, MAX_RETRY_AFTER)))

    @staticmethod
    def _answer(response: httpx.Response, answer: type[M] | None) -> M | None:
        if response.status_code >= 500:
            raise BrokerUnavailableError(f"{response.status_code}: {_detail(response)}")
        if response.status_code in {401, 403}:
            raise FencedError(response.status_code, _detail(response))
        if response.status_code == 204 or answer is None:
            if response.status_code >= 400:
                raise BrokerError(response.status_code, _detail(response))
            return None
        if response.status_code >= 400:
            raise BrokerError(response.status_code, _detail(response))
        return answer.model_validate_json(response.content)

    async def _must(
        self,
        method: str,
        path: str,
        body: BaseModel | None,
        answer: type[M],
        retries: int | None = None,
        unreached: int | None = None,
    ) -> M:
        result = await self._call(method, path, body, answer, retries=retries, unreached=unreached)
        assert result is not None
        return result

    # -- the API -------------------------------------------------------------------------
    async def start_call(self, body: ToolCallStart) -> Recorded:
        try:
            return await self._must("POST", "/runner/tool-calls/start", body, Recorded)
        except BrokerError as exc:
            if exc.status != 422 or not body.read_only:
                raise
        # A broker older than `read_only` refuses it: the start goes without (the call then
        # counts as an effect for the nudge rule there, as every call did before).
        plain = body.model_copy(update={"read_only": False})
        return await self._must("POST", "/runner/tool-calls/start", plain, Recorded)

    async def finish_call(self, body: ToolCallFinish) -> Recorded:
        return await self._must("POST", "/runner/tool-calls/finish", body, Recorded)

    async def append_history(self, entries: Sequence[HistoryEntryIn]) -> None:
        """In order, in batches small enough for one message of the platform's bus."""
        for batch in _batches(entries):
            await self._must("POST", "/runner/history", HistoryAppend(entries=batch), Recorded)

    async def compaction(self, marker: CompactionMarker) -> None:
        await self._must("POST", "/runner/history/compaction", marker, Recorded)

    async def stream(self, chunks: Sequence[StreamChunk], batch: int | None = None) -> None:
        """Live chunks; numbered batches (`batch` counting up from 0 within the activation)
        are published once however often a lost reply makes this send them."""
        body = StreamBatch(chunks=tuple(chunks), batch=batch)
        await self._must("POST", "/runner/stream", body, Recorded)

    async def signals(self, received: Sequence[str]) -> tuple[SignalSpec, ...]:
        """The due P1 signals. `received`: the ones the activation has already, newest last;
        only the newest of them are named (the loop drops a signal handed over again)."""
        try:
            try:
                body = SignalsTake(received=tuple(received[-MAX_RECEIVED:]))
                taken = await self._call("POST", "/runner/signals", body, SignalsTaken)
            except BrokerError as exc:
                if exc.status != 405:
                    raise
                # A broker from before the POST: the query string, of as many as a URL holds.
                query = {"received": list(received[-MAX_RECEIVED_IN_URL:])}
                taken = await self._call("GET", "/runner/signals", None, SignalsTaken, params=query)
        except BrokerError as exc:
            if exc.status == 409:  # the scheduler says it is not live any more
                raise FencedError(exc.status, exc.detail) from None
            raise
        assert taken is not None
        return taken.signals

    async def ask(self, request: AskRequest) -> AskOutcome:
        result = await self._call(
            "POST", "/runner/ask", request, AskOutcome, timeout=request.wait_seconds + 30
        )
        assert result is not None
        return result

    async def put_checkpoint(self, checkpoint: CheckpointPut) -> None:
        await self._must("PUT", "/runner/checkpoint", checkpoint, Recorded)

    async def get_checkpoint(self) -> CheckpointRef | None:
        return await self._call("GET", "/runner/checkpoint", None, CheckpointRef)

    async def support(self, toolpack: str, call: SupportCall) -> SupportResult:
        return await self._must("POST", f"/toolpacks/{toolpack}/support", call, SupportResult)

    async def credential(self, model: ModelSpec, base_url: str | None) -> str | None:
        """The current key of the provider `model` is called through, as its project holds
        it now (after the provider refused the one the runner has); None when the broker has
        none to give (404: not a provider of this agent, the platform's default endpoint, a
        broker from before the route), will not give one yet (429), or sent something else.

        Raises:
            FencedError: the activation may no longer act.
            BrokerUnavailableError: no answer below 500 (retried only a little: the loop
                falls back rather than waiting on it).
        """
        request = CredentialRequest(model=model.name, provider=model.provider, base_url=base_url)
        try:
            answer = await self._call(
                "POST", "/runner/credentials", request, CredentialAnswer, retries=2
            )
        except FencedError:
            raise
        except BrokerError as exc:
            log("model.credential_refused", model=model.name, status=exc.status, detail=exc.detail)
            return None
        except ValidationError:
            # Never echoed: the body may be a key in another shape.
            log("model.credential_unreadable", model=model.name)
            return None
        return answer.api_key if answer is not None else None

    async def output(
        self,
        output: RunnerActivationOutput,
        history: Sequence[HistoryEntryIn] = (),
        live: StreamBatch | None = None,
    ) -> None:
        """The activation's last call: its output, bringing the last history entries and live
        batch along when the entries fit one batch (else they go first, apart). A broker older
        than such calls refuses their schema version with a 422: then each goes apart."""
        batches = list(_batches(history))
        if len(batches) > 1:
            await self.append_history(history)
            batches = []
        if batches or live is not None:
            final = FinalCall(
                **output.model_dump(exclude={"schema_version"}),
                history=batches[0] if batches else (),
                live=live,
            )
            try:
                await self._must(
                    "POST", "/activation-output", final, Recorded,
                    self._output_retries, self._output_unreached,
                )  # fmt: skip
            except BrokerError as exc:
                if exc.status != 422:
                    raise
            else:
                return
            if live is not None:
                try:
                    await self.stream(live.chunks, live.batch)
                except FencedError:
                    raise
                except Exception as exc:
                    log("live.flush_failed", error=repr(exc), chunks=len(live.chunks))
            await self.append_history(history)
        await self._must(
            "POST", "/activation-output", output, Recorded,
            self._output_retries, self._output_unreached,
        )  # fmt: skip

    async def download(self, ref: InputFile, sink: BinaryIO) -> None:
        """The artifact's bytes into `sink` (from its start), checked against `ref`'s digest and
        size; an interrupted download starts over.

        Raises:
            BrokerError: refused (404: not an artifact of this session).
            ValueError: the bytes received are not the ones `ref` names.
        """
        await self._fetch(f"/runner/files/{ref.artifact_id}", ref, sink, "the artifact's")

    async def download_asset(self, ref: FileRef, sink: BinaryIO) -> None:
        """The agent package's asset into `sink`, as `download` brings an artifact.

        Raises:
            BrokerError: refused (404: not an asset of this activation's agent).
            ValueError: the bytes received are not the ones `ref` names.
        """
        await self._fetch(f"/runner/assets/{ref.sha256}", ref, sink, "the asset's")

    async def _fetch(self, path: str, ref: FileRef, sink: BinaryIO, whose: str) -> None:
        for attempt in range(self._retries + 1):
            sink.seek(0)
            sink.truncate()
            digest, size = hashlib.sha256(), 0
            try:
                async with self._http.stream("GET", path, headers=self._auth) as response:
                    if response.status_code >= 500:
                        await self._pause(attempt, f"GET {path}")
                        continue
                    if response.status_code >= 400:
                        await response.aread()
                        self._answer(response, None)
                    async for chunk in response.aiter_bytes(FILE_CHUNK):
                        digest.update(chunk)
                        size += len(chunk)
                        sink.write(chunk)
            except httpx.TransportError:
                await self._pause(attempt, f"GET {path}")
                continue
            if (digest.hexdigest(), size) != (ref.sha256, ref.size):
                raise ValueError(f"{ref.path}: the bytes received are not {whose}")
            return
        raise BrokerUnavailableError(f"GET {path}: gave up")  # pragma: no cover - loop returns

    async def upload(self, index: int, path: str, source: BinaryIO, size: int) -> bool:
        """One output file (its first `size` bytes, read from `source`'s start) as the
        activation's `index`th; False if the broker had it already (a retried upload).

        Raises:
            OutputChangedError: `source` holds fewer than `size` bytes now.
        """

        async def body() -> AsyncIterator[bytes]:
            # Exactly the declared Content-Length: a file that grew or shrank since its size
            # was taken made h11 raise its own error, which is neither httpx's nor a refusal.
            source.seek(0)
            left = size
            while left > 0:
                chunk = source.read(min(FILE_CHUNK, left))
                if not chunk:
                    raise OutputChangedError(f"{size - left} of {size} bytes: it shrank")
                left -= len(chunk)
                yield chunk

        url = f"/runner/files/out/{index}"
        headers = {
            **self._auth,
            "Content-Type": "application/octet-stream",
            "Content-Length": str(size),
        }
        response = await self._send("PUT", url, body, headers, params={"path": path})
        recorded = self._answer(response, Recorded)
        assert recorded is not None
        return recorded.recorded


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict):
        return str(body.get("detail") or body.get("code") or body)[:500]
    return str(body)[:500]


def _retry_after(response: httpx.Response) -> float:
    """The seconds of a Retry-After header (0 when there is none or it is a date)."""
    try:
        seconds = float(response.headers.get("retry-after", "0"))
    except ValueError:
        return 0.0
    return seconds if math.isfinite(seconds) and seconds > 0 else 0.0
