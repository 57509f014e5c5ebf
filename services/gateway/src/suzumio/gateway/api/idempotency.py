"""`Idempotency-Key` on every POST: a retried request gets the first one's response.

The first response (status, body, the headers that matter) is kept in a KV bucket for 24 h,
keyed by the caller's credentials, the path and the key, sealed with the platform's secret key
(some first responses show a new API key once; the bucket must not hold it in the clear).
The same key with a different body is refused (422); a retry while the first is still
running gets 409 (a running request says so again every 20 s; one silent for 60 s is taken
for dead and its retry runs, and only the request holding the slot keeps its answer). Every
answer is kept, errors too (a 504 of the read models' lag follows a command that did run, and
a retry must not run it twice), except 401 (nothing ran for an unknown caller), 404 (nothing
ran; it may be the read models' lag), 500 (answered outside this layer, which sees no answer),
503 (no service took the request, or NATS or Postgres
were in trouble under it: nothing was stored, or an append's fate was unknown — either way a
retry sends it again under the same ids, which runs or is refused as a duplicate) and a
command's own timeout (the same). As ASGI middleware, no POST route can forget it.

An upload (multipart) streams through unbuffered: its digest is taken as it passes and kept
with the answer; a retry's is taken (its body read) before that answer is replayed. An upload
that was not read to its end keeps no answer: it stored nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from suzumio.gateway.api.deps import presented_key
from suzumio.gateway.api.problems import FATE_UNKNOWN, problem_response, unavailable
from suzumio.platform.logging import get_logger
from suzumio.platform.secrets import SecretBox
from suzumio.platform.trouble import is_trouble

log = get_logger(__name__)
HEADER = b"idempotency-key"
KEPT_HEADERS = {b"content-type", b"location", b"suzumio-position"}
STALE_PENDING_SECONDS = 60.0
MAX_BUFFERED_BODY = 16 * 1024 * 1024
_BOUNDARY = re.compile(rb'boundary=(?:"([^"]+)"|([^;\s]+))', re.IGNORECASE)


class IdempotencyMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        kv: Callable[[], KeyValue],
        box: Callable[[], SecretBox],
        valid_key: Callable[[str], Awaitable[bool | None]],
    ) -> None:
        self.app = app
        self._kv = kv
        self._box = box
        self._valid_key = valid_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        key = headers.get(HEADER)
        if key is None:
            await self.app(scope, receive, send)
            return
        if not 1 <= len(key) <= 255 or not all(33 <= c <= 126 for c in key):
            await problem_response(
                422, "invalid", "Idempotency-Key must be 1-255 visible ASCII characters"
            )(scope, receive, send)
            return
        # The key the request authenticates with, found as the routes find it: another
        # `Authorization` (a proxy's Basic one, say) beside an X-API-Key is not the caller,
        # and slots keyed on it would hand one caller's answers (a new key) to another.
        caller = credentials(scope).encode("latin-1")
        path = scope["path"].encode() + b"?" + scope.get("query_string", b"")
        slot = hashlib.sha256(b"\n".join([caller, path, key])).hexdigest()
        # The routes name what they create after the slot (`Mint`): a retry whose first answer
        # was lost (a crash before it was kept, a failed save) names the same aggregates, and
        # the session service refuses them as duplicates instead of creating them twice.
        scope.setdefault("state", {})["idempotency_slot"] = slot
        body: _Body
        if headers.get(b"content-type", b"").startswith(b"multipart/"):
            body = _StreamedBody(path, headers[b"content-type"], receive)  # not buffered
        else:
            try:
                body = await _BufferedBody.read(path, receive)
            except _TooLargeError:
                await problem_response(413, "too_large", "the request body is too large")(
                    scope, receive, send
                )
                return
            except _GoneError:
                return  # what came is not the request: nothing runs, nobody to answer
        await self._handle(slot, body, scope, send)

    async def _handle(self, slot: str, body: _Body, scope: Scope, send: Send) -> None:
        claim = _Claim(self._kv(), slot, body.early)
        try:
            answered = await self._take(claim, body, scope, send)
        except Exception as exc:
            # Out here the routes' handlers are not around (they answer inside the app): the
            # platform's servers in trouble would be a 500, which says "do not retry".
            if not is_trouble(exc):
                raise
            await _let_go(claim)
            await unavailable(scope["path"], exc)(scope, body.receive, send)
            return
        if answered:
            return
        recorded = _Recorder(send)
        # Said to be alive while it runs: a request past STALE_PENDING_SECONDS (a long upload,
        # long timeouts) was taken over by its retry and run twice.
        ended = asyncio.Event()
        refreshing = asyncio.create_task(_refresh(claim, ended))
        try:
            await self.app(scope, body.receive, recorded.send)
        finally:
            ended.set()  # not cancelled: a write cut off midway would leave its revision unknown
            await refreshing
            await self._keep(claim, body, recorded, scope)

    async def _take(self, claim: _Claim, body: _Body, scope: Scope, send: Send) -> bool:
        """Take the slot for this request; True when it was answered here instead (a kept
        answer replayed, a conflict)."""
        kv, slot = claim.kv, claim.slot
        for _ in range(3):  # the first request may delete its slot (401, 503) while we look
            try:
                claim.revision = await kv.create(slot, claim.pending())
                break
            except KeyWrongLastSequenceError:
                try:
                    answered = await self._existing(kv, slot, body, claim)
                except KeyNotFoundError:
                    continue
                if answered is not None:
                    valid = await self._valid_key(credentials(scope))
                    if valid is None:  # the key could not be checked now (nor is anything kept)
                        answered = problem_response(
                            503,
                            "unavailable",
                            "the API key cannot be checked now; try again",
                            headers={"Retry-After": "1"},
                        )
                    elif not valid:
                        # A kept answer is the route's, which checks the key first: a revoked
                        # or expired key must not get its answers (a new key's secret) replayed.
                        answered = problem_response(
                            401,
                            "unauthenticated",
                            "the API key is not valid",
                            headers={"WWW-Authenticate": "Bearer"},
                        )
                    await answered(scope, body.receive, send)
                    return True
                break
        return False

    async def _existing(
        self, kv: KeyValue, slot: str, body: _Body, claim: _Claim
    ) -> ASGIApp | None:
        entry = await kv.get(slot)
        record = json.loads(entry.value or b"{}")
        # A kept answer has the whole body's digest; an upload's is known once it was read.
        fingerprint = await body.whole() if record.get("state") == "done" else body.early
        if record.get("fp") != fingerprint:
            return problem_response(
                422, "invalid", "this Idempotency-Key was used with a different request"
            )
        if record.get("state") == "done":
            return _replay(record, self._box())
        if time.time() - record.get("at", 0) < STALE_PENDING_SECONDS:
            return problem_response(
                409, "conflict", "a request with this Idempotency-Key is still in progress"
            )
        try:  # the first attempt died mid-way: take over
            claim.revision = await kv.update(slot, claim.pending(), last=entry.revision)
        except KeyWrongLastSequenceError:
            return problem_response(
                409, "conflict", "a request with this Idempotency-Key is still in progress"
            )
        return None

    async def _keep(self, claim: _Claim, body: _Body, recorded: _Recorder, scope: Scope) -> None:
        """Keep the answer in the slot (or free it), if the slot is still this request's: one
        taken over meanwhile (this request was thought dead) is its successor's to fill."""
        try:
            fingerprint = body.seen()
            # A command that timed out may or may not have run: not kept, a retry sends it
            # again under the same ids — it runs if the first never did, and is refused as a
            # duplicate (409) if it did. Kept, its 504 would be all the retries ever learn.
            unknown = bool(scope.get("state", {}).get(FATE_UNKNOWN))
            # A 404 is a refusal before anything ran (routes look before they act), and may
            # be the read models' lag (a cancel of an activation the stream just showed):
            # kept, every retry would get it for a day.
            skipped = recorded.status in (None, 401, 404, 503) or unknown or recorded.too_big
            if skipped or fingerprint is None:
                if not await claim.write(None):
                    log.warning("idempotency.slot_taken_over", slot=claim.slot)
                return
            record = {
                "state": "done",
                "fp": fingerprint,
                "status": recorded.status,
                "headers": [[k.decode(), v.decode()] for k, v in recorded.headers],
                "body": self._box().seal_bytes(bytes(recorded.body)).decode(),
            }
            if not await claim.write(json.dumps(record).encode()):
                log.warning("idempotency.slot_taken_over", slot=claim.slot)
        except Exception:
            log.exception("idempotency.keep_failed")


@dataclass
class _Claim:
    """A request's hold on its slot: the pending record it wrote (told from a successor's by
    its nonce) and that record's revision, as far as it knows."""

    kv: KeyValue
    slot: str
    fingerprint: str
    nonce: str = field(default_factory=lambda: secrets.token_hex(8))
    revision: int | None = None

    def pending(self) -> bytes:
        record = {"state": "pending", "fp": self.fingerprint, "at": time.time(), "n": self.nonce}
        return json.dumps(record).encode()

    async def write(self, value: bytes | None) -> bool:
        """Put `value` (None: nothing) in place of this request's record; False when the slot
        is no longer this request's (taken over: it was thought dead)."""
        for _ in range(2):
            try:
                if value is None:
                    await self.kv.delete(self.slot, last=self.revision)
                else:
                    self.revision = await self.kv.update(self.slot, value, last=self.revision)
            except APIError as exc:
                # nats-py turns the wrong-revision refusal into its own error for an update
                # only; a delete's comes as the server's code.
                wrong_last = isinstance(exc, KeyWrongLastSequenceError) or (
                    getattr(exc, "err_code", None) in _WRONG_LAST
                )
                if not wrong_last:
                    raise
                if not await self._still_ours():
                    return False
            else:
                return True
        return False

    async def _still_ours(self) -> bool:
        """Whether the slot still holds this request's pending record — an earlier write of
        it landed though its answer was lost (a publish timed out), moving its revision: that
        revision is then this request's."""
        try:
            entry = await self.kv.get(self.slot)
        except KeyNotFoundError:
            return False
        record = json.loads(entry.value or b"{}")
        if record.get("state") != "pending" or record.get("n") != self.nonce:
            return False
        self.revision = entry.revision
        return True


_WRONG_LAST = frozenset({10071, 10164})  # JetStream: wrong last (subject) sequence
LET_GO_SECONDS = 2.0


async def _let_go(claim: _Claim) -> None:
    """Free the slot if this request's pending record is in it (a write whose answer was lost
    may have landed): the 503's retry, with the same key, would be told for a minute that the
    request is still in progress — while nothing ran. Best-effort: the platform is in trouble."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(LET_GO_SECONDS):
            if await claim._still_ours():
                await claim.write(None)


async def _refresh(claim: _Claim, ended: asyncio.Event) -> None:
    """Write the pending record again every third of STALE_PENDING_SECONDS until `ended`;
    stop once the slot is no longer this request's."""
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ended.wait(), STALE_PENDING_SECONDS / 3)
            return
        try:
            if not await claim.write(claim.pending()):
                return
        except Exception as exc:  # the bus away a moment: the next beat tries again
            log.warning("idempotency.refresh_failed", error=repr(exc))


class _TooLargeError(Exception):
    pass


class _GoneError(Exception):
    """The client went away (or a body limit cut it off) before its body ended."""


class _BufferedBody:
    """A body read whole before the request runs (at most MAX_BUFFERED_BODY)."""

    def __init__(self, body: bytes, digest: str) -> None:
        self._body, self.early = body, digest
        self._sent = False

    @classmethod
    async def read(cls, path: bytes, receive: Receive) -> _BufferedBody:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                # Not the body's end: never run on the part that came. A request cut short
                # (by a body limit too, which says so with a disconnect) may be valid JSON.
                raise _GoneError
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BUFFERED_BODY:
                raise _TooLargeError
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        return cls(body, hashlib.sha256(path + b"\n" + body).hexdigest())

    async def receive(self) -> Message:
        if self._sent:
            return {"type": "http.disconnect"}
        self._sent = True
        return {"type": "http.request", "body": self._body, "more_body": False}

    async def whole(self) -> str:
        return self.early

    def seen(self) -> str | None:
        return self.early


class _StreamedBody:
    """An upload, digested as it passes through to the route. Until it has, `early` (its
    path alone) is what a pending slot is compared by.

    The digest leaves out the multipart boundary, which a client draws anew for each request:
    the same files sent again are the same request."""

    def __init__(self, path: bytes, content_type: bytes, receive: Receive) -> None:
        self._receive = receive
        self._digest = hashlib.sha256(path + b"\n")
        found = _BOUNDARY.search(content_type)
        self._boundary = (found.group(1) or found.group(2)) if found else b""
        self._held = b""  # the end of what came, if it may be the start of a boundary
        self._ended = False
        self.early = "upload:" + hashlib.sha256(path).hexdigest()

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request" and not self._ended:
            self._ended = not message.get("more_body")
            self._feed(message.get("body", b""))
        return message

    def _feed(self, chunk: bytes) -> None:
        data, boundary = self._held + chunk, self._boundary
        keep = 0
        if boundary and not self._ended:  # a boundary may go on in the next chunk
            keep = next(
                (n for n in range(min(len(boundary) - 1, len(data)), 0, -1)
                 if data.endswith(boundary[:n])),
                0,
            )  # fmt: skip
        ready, self._held = data[: len(data) - keep], data[len(data) - keep :]
        self._digest.update(ready.replace(boundary, b"<boundary>") if boundary else ready)

    async def whole(self) -> str:
        """Its digest, read to its end first (a retry whose answer is replayed, not run)."""
        while not self._ended:
            if (await self.receive())["type"] == "http.disconnect":
                return "upload:cut short"
        return self._digest.hexdigest()

    def seen(self) -> str | None:
        """Its digest if the route read it to its end, else None."""
        return self._digest.hexdigest() if self._ended else None


_Body = _BufferedBody | _StreamedBody


class _Recorder:
    def __init__(self, send: Send) -> None:
        self._send = send
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()
        self.too_big = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = [(k, v) for k, v in message.get("headers", []) if k in KEPT_HEADERS]
        elif message["type"] == "http.response.body":
            if len(self.body) < MAX_BUFFERED_BODY:
                self.body.extend(message.get("body", b""))
            else:
                self.too_big = True
        await self._send(message)


def _replay(record: dict[str, Any], box: SecretBox) -> ASGIApp:
    body = box.open_bytes(record["body"].encode())
    headers = [(k.encode(), v.encode()) for k, v in record["headers"]]
    headers += [(b"content-length", str(len(body)).encode()), (b"idempotent-replayed", b"true")]

    async def app(scope: Scope, receive: Receive, send: Send) -> None:  # noqa: ARG001
        await send({"type": "http.response.start", "status": record["status"], "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def credentials(scope: Scope) -> str:
    """The key the request authenticates with, found as the routes find it: another
    `Authorization` (a proxy's Basic one, say) beside an X-API-Key is not the caller."""
    return presented_key(Headers(scope=scope)) or ""
