"""The model relay: a sandbox without any network (network profile `none`: docker, or the
process backend with bubblewrap) reaches the broker alone, through a Unix socket bound into it,
and calls its models here. The broker calls the endpoint with the key, so the sandbox never
holds one.

- `POST /runner/models/default/chat/completions`: the platform's default endpoint
  (`SUZUMIO_MODEL_BASE_URL` / `SUZUMIO_MODEL_API_KEY`, as the broker has them), for a model
  of the agent's chain that names no provider;
- `POST /runner/models/providers/{name}/chat/completions`: the project's provider `name` (its
  endpoint and its current key, opened with the platform's secret key), for a model of the
  agent's chain that names it.

The caller is an activation (its token as the bearer key: the runner gives the SDK its token
as the API key), and the body's `model` must be one its agent calls that way, as the log holds
the agent now; anything else is 404, as `POST /runner/credentials` answers. The body goes on
as it came, the answer comes back as it streams (status, type, `Retry-After`), so the runner's
SDK classifies a provider's refusals as it would have itself. An error answer's body has the
key replaced (a provider quoting the key it refused must not put it in the runner's output:
the runner, which never had the key, could not redact it). An endpoint that cannot be reached
is 502; a stream broken midway breaks the runner's too (never a reply cut short that looks
whole).

The relay calls from the broker's place in the network, not the sandbox's: a project's
provider whose host is a loopback, private or link-local address is refused unless the
operator allows it, and the call connects to the addresses that were checked (a second DNS
answer cannot swap in another: `pinned_http`). An activation may hold only a few calls open
at once, a project only so many on a broker, and no call outlives its activation's token or
the operator's longest call.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

import httpx
from fastapi import APIRouter, Path, Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from suzumio.contracts.addresses import IPAddress, refused_reason
from suzumio.contracts.values import ModelSpec
from suzumio.platform.logging import get_logger
from suzumio.platform.secrets import SecretError
from suzumio.platform.service.stream_cut import StreamCutError
from suzumio.platform.shares import Shares
from suzumio.toolbroker.access import Caller
from suzumio.toolbroker.model_chain import model_chain, provider_of
from suzumio.toolbroker.pinned_http import pinned, pinning_client
from suzumio.toolbroker.problems import BrokerError
from suzumio.toolbroker.redaction import redacted
from suzumio.toolbroker.registry import LiveActivation
from suzumio.toolbroker.routes import Auth, Shared
from suzumio.toolbroker.state import Broker

log = get_logger(__name__)
T = TypeVar("T")
router = APIRouter()
# A stream a provider compressed all the same (it is asked for none) goes on as it came, for
# the runner to decode: decoded here, a few compressed bytes could grow to gigabytes at once.
PASSED_HEADERS = (
    "content-type", "content-encoding", "retry-after", "retry-after-ms", "x-request-id"
)  # fmt: skip
# An error answer compressed all the same is not passed on: the key it may quote cannot be
# taken out of it unread, and the sandbox could open it.
WITHHELD = json.dumps(
    {
        "error": {
            "message": "the provider's error answer came compressed, which the relay does "
            "not open: withheld, as it may quote the key",
            "type": "relay_error",
        }
    }
).encode()
MAX_ERROR_BYTES = 1 << 20  # an error answer is read whole, to take the key out of it
# Relayed calls one activation may have open at once: its loop makes one at a time (two with
# a compaction's); more is a sandbox holding the relay's connections from everyone else.
MAX_CALLS_PER_ACTIVATION = 4
PARSE_ON_LOOP_BYTES = 256 * 1024  # a larger request body is parsed on a thread
# How often a relayed stream waiting on its provider looks whether its activation still lives.
FENCE_CHECK_SECONDS = 1.0
# A stream whose runner stopped reading is closed this long after its deadline (its reads
# end at the deadline itself; this is for one waiting on the runner, not the provider).
STALLED_GRACE_SECONDS = 1.0

Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]


@dataclass(frozen=True)
class Upstream:
    base_url: str
    api_key: str | None
    # A project's provider: its host is resolved and checked (`check_provider`) as the call
    # starts, and the call connects to the addresses checked. Not checked: the platform's
    # default endpoint, the operator's own.
    checked: bool = False


# Lookups of providers' names run in threads of their own: a project's name server that never
# answers holds a thread past the call's deadline (a thread cannot be stopped), and must not
# hold the ones the rest of the broker works in.
_LOOKUPS = ThreadPoolExecutor(max_workers=32, thread_name_prefix="relay-lookup")
# Lookups one project may have running: one whose name server never answers holds its
# threads until the resolver gives up, and took every one of the pool's — every other
# project's relayed calls waiting behind them to their deadlines.
LOOKUPS_PER_PROJECT = 2


async def _resolve(host: str, port: int) -> list[IPAddress]:
    infos = await asyncio.get_running_loop().run_in_executor(
        _LOOKUPS, partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
    )
    addresses: list[IPAddress] = []
    for *_, sockaddr in infos:
        # A scoped IPv6 address (`fe80::1%eth0`) is a link's own: kept with its scope, it is
        # refused as link-local below.
        address = ipaddress.ip_address(str(sockaddr[0]))
        if address not in addresses:
            addresses.append(address)
    return addresses


class ModelRelay:
    """The relay's one HTTP client (a pool per endpoint), and the default endpoint."""

    def __init__(
        self,
        default: Upstream | None,
        read_timeout: float,
        *,
        allow_private: bool = False,
        call_seconds: float = 1_800.0,
        max_calls_per_project: int = 64,
        resolver: Resolver = _resolve,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self.default = default
        self._allow_private = allow_private
        self._call_seconds = call_seconds
        self._max_per_project = max_calls_per_project
        self._resolve = resolver
        self._open = Shares()  # activation → its relayed calls still open
        self._open_in_project = Shares()  # project → its relayed calls still open
        self._looking_up = Shares()  # project → its lookups still running (in their threads)
        self._closing: set[asyncio.Task[None]] = set()
        self._http = pinning_client(
            httpx.Timeout(10.0, read=read_timeout, write=60.0),
            httpx.Limits(max_connections=200, max_keepalive_connections=50),
            verify,
        )

    async def check_provider(
        self, base_url: str, via: str, project: str | None = None
    ) -> tuple[IPAddress, ...]:
        """A project's provider endpoint, called from the broker's place in the network (not
        the sandbox's): refused (403) when its host resolves to a loopback, private,
        link-local or other non-global address — the platform's own servers, a cloud's
        metadata service — unless the operator allows it (`relay_allow_private_providers`),
        and when it carries a query or a fragment (the relay's path would land in them).
        Returns the addresses checked, which the call then goes to.
        The platform's default endpoint is the operator's own, and is not checked."""
        parts = urlsplit(base_url)
        if parts.query or parts.fragment:
            raise BrokerError(
                403, "forbidden", f"provider {via!r}: an endpoint with a query is not called"
            )
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
            host = parts.hostname or ""
            try:
                addresses = [ipaddress.ip_address(host)]
            except ValueError:
                addresses = await self._looked_up(host, port, via, project)
        except (OSError, ValueError, UnicodeError):
            addresses = []
        if not addresses:
            raise BrokerError(
                502, "model_unreachable", f"provider {via!r}: its host does not resolve"
            )
        if self._allow_private:
            # A scoped IPv6 address (`fe80::1%eth0`) names a link of this host's, no endpoint.
            reachable = tuple(a for a in addresses if not _scoped(a))
            if not reachable:
                raise BrokerError(
                    502, "model_unreachable", f"provider {via!r}: its host does not resolve"
                )
            return reachable
        for address in addresses:
            reason = "link-local" if _scoped(address) else refused_reason(address)
            if reason is not None:
                raise BrokerError(
                    403,
                    "forbidden",
                    f"provider {via!r}: its endpoint is a {reason} address, which the relay "
                    "calls only where SUZUMIO_RELAY_ALLOW_PRIVATE_PROVIDERS is set",
                )
        return tuple(addresses)

    async def _looked_up(
        self, host: str, port: int, via: str, project: str | None
    ) -> list[IPAddress]:
        """`host`'s addresses, within the project's share of lookups. A lookup runs on in its
        thread after its call gave up (a thread cannot be stopped), and holds the share until
        it ends."""
        if project is None:
            return await self._resolve(host, port)
        if self._looking_up.held(project) >= LOOKUPS_PER_PROJECT:
            raise BrokerError(
                503,
                "unavailable",
                f"provider {via!r}: earlier lookups of this project's providers' names are "
                "still unanswered",
                {"Retry-After": "5"},
            )
        end = self._looking_up.take(project)
        lookup = asyncio.ensure_future(self._resolve(host, port))

        def ended(task: asyncio.Future[list[IPAddress]]) -> None:
            end()
            if not task.cancelled():
                task.exception()  # seen, when the call that asked gave up before it came

        lookup.add_done_callback(ended)
        return await asyncio.shield(lookup)

    def _lease(self, activation_id: str, project_id: str) -> Callable[[], None]:
        """One more open call of the activation's and of its project's (429 past either's
        share); what ends it, once."""
        if self._open.held(activation_id) >= MAX_CALLS_PER_ACTIVATION:
            raise BrokerError(
                429,
                "too_many_requests",
                f"an activation has at most {MAX_CALLS_PER_ACTIVATION} relayed calls open",
                {"Retry-After": "1"},
            )
        if self._open_in_project.held(project_id) >= self._max_per_project:
            raise BrokerError(
                429,
                "too_many_requests",
                f"a project has at most {self._max_per_project} relayed calls open on a broker "
                "(SUZUMIO_RELAY_MAX_CALLS_PER_PROJECT)",
                {"Retry-After": "1"},
            )
        ends = (self._open.take(activation_id), self._open_in_project.take(project_id))

        def release() -> None:
            for end in ends:
                end()

        return release

    def _deadline(self, caller: Caller) -> float:
        """The loop time the call must be over by: the operator's longest call, and never
        past the activation's token (a stream the provider trickles forever would hold a
        place of the relay's after its activation is over)."""
        left = (caller.claims.expires_at - datetime.now(UTC)).total_seconds()
        return asyncio.get_running_loop().time() + max(min(self._call_seconds, left), 0.0)

    def lease(self, caller: Caller) -> Callable[[], None]:
        """The caller's place in the relay (429 past the activation's or the project's
        share), taken before its body is read: the body of a call may be tens of megabytes,
        and read (and parsed) beyond the share, a sandbox's many calls at once took the
        broker's memory and event loop."""
        return self._lease(caller.claims.activation_id, caller.claims.project_id)

    async def forward(
        self,
        upstream: Upstream,
        body: bytes,
        caller: Caller,
        via: str,
        release: Callable[[], None] | None = None,
    ) -> Response:
        """The call, under its place in the relay (`lease`, taken here when not given: given
        back when the answer has gone, or here if it fails) and its deadline."""
        if release is None:
            release = self.lease(caller)
        try:
            return await self._forward(upstream, body, caller, via, release)
        except BaseException:
            release()
            raise

    async def _forward(
        self,
        upstream: Upstream,
        body: bytes,
        caller: Caller,
        via: str,
        release: Callable[[], None],
    ) -> Response:
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream, application/json",
            "accept-encoding": "identity",  # passed on as it comes: no encoding to undo
        }
        if upstream.api_key:
            headers["authorization"] = f"Bearer {upstream.api_key}"
        url = upstream.base_url.rstrip("/") + "/chat/completions"
        started = time.monotonic()
        deadline = self._deadline(caller)
        try:
            async with asyncio.timeout_at(deadline):
                addresses = (
                    await self.check_provider(upstream.base_url, via, caller.claims.project_id)
                    if upstream.checked
                    else ()
                )
                # A provider that answers a whole reply at once sends its headers last: the wait
                # is cut when the activation is, not left to the deadline (half an hour).
                answer = await _while_live(
                    self._send(url, body, headers, addresses),
                    deadline,
                    caller.activation,
                    unused=_closed,
                )
        except _FencedError:
            activation = caller.activation
            log.info("model_relay.fenced", via=via, activation=activation.id,
                     why=activation.fenced)  # fmt: skip
            raise BrokerError(403, "fenced", f"the activation is {activation.fenced}") from None
        except TimeoutError:
            log.warning("model_relay.too_long", via=via, stage="answer")
            raise BrokerError(
                504, "model_unreachable", f"the model endpoint did not answer in time ({via})"
            ) from None
        except httpx.HTTPError as exc:
            log.warning("model_relay.unreachable", via=via, error=type(exc).__name__)
            raise BrokerError(
                502, "model_unreachable", f"the model endpoint could not be reached ({via})"
            ) from None
        passed = {k: v for k in PASSED_HEADERS if (v := answer.headers.get(k)) is not None}
        log.info(
            "model_relay.answered",
            activation=caller.claims.activation_id,
            via=via,
            status=answer.status_code,
            ms=round((time.monotonic() - started) * 1000, 1),
        )
        if answer.status_code >= 400:
            return await _error_answer(answer, upstream, passed, deadline, release)

        loop = asyncio.get_running_loop()

        def stalled() -> None:
            # A runner that stopped reading holds the send, not a read: the deadline of the
            # reads never comes. Its place and the provider's connection are given back here.
            release()
            closing = loop.create_task(answer.aclose())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

        timer = loop.call_at(deadline + STALLED_GRACE_SECONDS, stalled)

        async def done() -> None:
            timer.cancel()
            release()
            await answer.aclose()

        # Ended by the stream's end or by the runner leaving (either may come first).
        return StreamingResponse(
            _relayed(answer, via, release, deadline, caller.activation),
            status_code=answer.status_code,
            headers=passed,
            background=BackgroundTask(done),
        )

    async def _send(
        self, url: str, body: bytes, headers: dict[str, str], addresses: tuple[IPAddress, ...]
    ) -> httpx.Response:
        """The request; a new connection goes to the checked addresses, when there are."""
        request = self._http.build_request("POST", url, content=body, headers=headers)
        if not addresses:
            return await self._http.send(request, stream=True)
        with pinned(request.url.raw_host.decode("ascii"), addresses):
            return await self._http.send(request, stream=True)


async def _error_answer(
    answer: httpx.Response,
    upstream: Upstream,
    passed: dict[str, str],
    deadline: float,
    release: Callable[[], None],
) -> Response:
    """A provider's error, read whole (bounded) with the key taken out; withheld when it
    came compressed."""
    if passed.pop("content-encoding", "identity").strip().lower() != "identity":
        await answer.aclose()
        release()
        passed["content-type"] = "application/json"
        return Response(WITHHELD, status_code=answer.status_code, headers=passed)
    try:
        async with asyncio.timeout_at(deadline):
            text = await _bounded(answer)
    except (httpx.HTTPError, TimeoutError):
        text = b""
    finally:
        await answer.aclose()
        release()
    if upstream.api_key:  # up to a MiB the provider chose: not on the loop
        cut = len(text) >= MAX_ERROR_BYTES
        text = await asyncio.to_thread(partial(redacted, text, upstream.api_key, cut=cut))
    return Response(text, status_code=answer.status_code, headers=passed)


def _scoped(address: IPAddress) -> bool:
    return isinstance(address, ipaddress.IPv6Address) and address.scope_id is not None


async def _bounded(answer: httpx.Response) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in answer.aiter_raw():
        chunks.append(chunk)
        size += len(chunk)
        if size >= MAX_ERROR_BYTES:
            break
    return b"".join(chunks)[:MAX_ERROR_BYTES]


async def _relayed(
    answer: httpx.Response,
    via: str,
    release: Callable[[], None],
    deadline: float,
    activation: LiveActivation,
) -> AsyncIterator[bytes]:
    chunks = answer.aiter_raw()
    try:
        while (chunk := await _next_by(chunks, deadline, activation)) is not None:
            yield chunk
    except _FencedError as exc:
        # Its activation was cancelled (or ended, or replaced) meanwhile: nothing the model
        # says now can count, and the provider's bill and the relay's place go on until cut.
        log.info("model_relay.fenced", via=via, activation=activation.id, why=activation.fenced)
        raise StreamCutError(f"the activation is {activation.fenced}") from exc
    except TimeoutError as exc:
        # Cut like a broken stream: the runner's SDK sees a connection that ended early.
        log.warning("model_relay.too_long", via=via, stage="stream")
        raise StreamCutError("the model call outlasted its time") from exc
    except httpx.HTTPError as exc:
        # Cut: the runner's SDK sees a broken stream (retried), not an answer that ends
        # early as if it were whole.
        log.warning("model_relay.stream_broken", via=via, error=type(exc).__name__)
        raise StreamCutError("the provider's stream broke") from exc
    finally:
        release()
        await answer.aclose()


class _FencedError(Exception):
    pass


async def _closed(answer: httpx.Response) -> None:
    await answer.aclose()


async def _next_by(
    chunks: AsyncIterator[bytes], deadline: float, activation: LiveActivation
) -> bytes | None:
    """The stream's next chunk (None at its end), read by the deadline and while the
    activation lives. The deadline bounds each read, never the relay's yield: the consumer's
    own waits (sending to the runner) are not ours to cancel (a stalled one is `stalled`'s,
    which closes the answer: past the deadline it is not read again)."""
    return await _while_live(anext(chunks, None), deadline, activation)


async def _while_live(
    work: Awaitable[T],
    deadline: float,
    activation: LiveActivation,
    unused: Callable[[T], Awaitable[None]] | None = None,
) -> T:
    """`work`'s result, waited for by the deadline (else TimeoutError) and while the
    activation lives (else `_FencedError`; looked at every `FENCE_CHECK_SECONDS` of the wait:
    a provider may think for minutes). `work` is cancelled when the wait ends without it;
    `unused` is given its result when it came as the wait was cancelled."""
    loop = asyncio.get_running_loop()
    task: asyncio.Future[T] = asyncio.ensure_future(work)
    try:
        while True:
            if activation.fenced:
                raise _FencedError
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError
            done, _ = await asyncio.wait({task}, timeout=min(left, FENCE_CHECK_SECONDS))
            if done:
                return task.result()
    except asyncio.CancelledError:
        if unused is not None and task.done() and not task.cancelled() and not task.exception():
            with contextlib.suppress(httpx.HTTPError):  # the cancel goes on, whatever comes
                await unused(task.result())
        raise
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await task


def _relay(broker: Broker) -> ModelRelay:
    if broker.relay is None:
        raise BrokerError(404, "not_found", "this broker relays no model calls")
    return broker.relay


async def _asked_model(request: Request) -> tuple[bytes, str]:
    body = await request.body()
    try:
        # A large body off the loop: parsing megabytes held every other call meanwhile.
        if len(body) < PARSE_ON_LOOP_BYTES:
            asked, twice = _read_model(body)
        else:
            asked, twice = await asyncio.to_thread(_read_model, body)
    except (ValueError, RecursionError):  # nested past the parser's depth: no request either
        raise BrokerError(400, "invalid", "the body is not JSON") from None
    model = asked.get("model") if isinstance(asked, dict) else None
    if not isinstance(model, str):
        raise BrokerError(422, "invalid", "the body names no model")
    if twice:
        # Checked here by the last, forwarded as sent: a provider that reads the first would
        # be called for a model outside the agent's chain, on the platform's or project's key.
        raise BrokerError(422, "invalid", "the body names its model more than once")
    return body, model


def _read_model(body: bytes) -> tuple[Any, bool]:
    """The body, and whether its object names `model` more than once (json keeps the last)."""
    asked = json.loads(body)
    if not isinstance(asked, dict) or (body.count(b'"model"') < 2 and b"\\u" not in body):
        return asked, False  # not an object, or cannot hold two (a scan in C: the common case)
    top = json.loads(body, object_pairs_hook=_pairs)
    return asked, isinstance(top, list) and sum(1 for k, _ in top if k == "model") > 1


def _pairs(items: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    return items


def _in_chain(chain: tuple[ModelSpec, ...], model: str, provider: str | None) -> bool:
    return any(m.name == model and m.provider == provider for m in chain)


@router.post("/runner/models/default/chat/completions")
async def relay_default(request: Request, caller: Auth, broker: Shared) -> Response:
    """A chat completion of the platform's default endpoint, for the caller's agent."""
    relay = _relay(broker)
    return await _leased(relay, caller, "default", _default_call(relay, broker, caller, request))


async def _leased(
    relay: ModelRelay, caller: Caller, via: str, call: Awaitable[tuple[Upstream, bytes]]
) -> Response:
    """`call` (reading and checking the request) and its forwarding, under the caller's
    place in the relay, taken first (`ModelRelay.lease`)."""
    try:
        release = relay.lease(caller)
    except BaseException:
        if isinstance(call, Coroutine):
            call.close()  # never started: no "never awaited" warning
        raise
    try:
        upstream, body = await call
    except BaseException:
        release()
        raise
    return await relay.forward(upstream, body, caller, via, release)


async def _default_call(
    relay: ModelRelay, broker: Broker, caller: Caller, request: Request
) -> tuple[Upstream, bytes]:
    body, model = await _asked_model(request)
    if not _in_chain(await model_chain(broker, caller), model, None):
        raise BrokerError(
            404, "not_found", f"the activation's agent calls no model {model!r} without a provider"
        )
    if relay.default is None:
        raise BrokerError(
            404, "not_found", "this broker has no default model endpoint (SUZUMIO_MODEL_BASE_URL)"
        )
    return relay.default, body


@router.post("/runner/models/providers/{name}/chat/completions")
async def relay_provider(
    name: Annotated[str, Path(max_length=100)], request: Request, caller: Auth, broker: Shared
) -> Response:
    """A chat completion of the project's provider `name`, for the caller's agent."""
    return await _leased(
        _relay(broker), caller, name, _provider_call(broker, caller, request, name)
    )


async def _provider_call(
    broker: Broker, caller: Caller, request: Request, name: str
) -> tuple[Upstream, bytes]:
    body, model = await _asked_model(request)
    if not _in_chain(await model_chain(broker, caller), model, name):
        raise BrokerError(
            404,
            "not_found",
            f"the activation's agent calls no model {model!r} through provider {name!r}",
        )
    provider = await provider_of(broker, caller.claims.project_id, name)
    if provider is None:
        raise BrokerError(404, "not_found", f"the project has no provider {name!r}")
    api_key: str | None = None
    if provider.api_key is not None:
        if broker.credentials is None:
            raise BrokerError(
                502, "model_unreachable", "this broker cannot open provider keys (no secret key)"
            )
        try:
            api_key = broker.credentials.box.open(provider.api_key)
        except SecretError as exc:
            log.warning("model_relay.key_unopenable", provider=name, error=str(exc))
            raise BrokerError(502, "model_unreachable", f"provider {name!r}: {exc}") from None
    return Upstream(provider.base_url, api_key or None, checked=True), body
