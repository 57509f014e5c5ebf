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
operator allows it, and an activation may hold only a few calls open at once.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import urlsplit

import httpx
from fastapi import APIRouter, Path, Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from suzumio.contracts.addresses import refused_reason
from suzumio.contracts.values import ModelSpec
from suzumio.platform.logging import get_logger
from suzumio.platform.secrets import SecretError
from suzumio.toolbroker.access import Caller
from suzumio.toolbroker.model_chain import model_chain, provider_of
from suzumio.toolbroker.problems import BrokerError
from suzumio.toolbroker.routes import Auth, Shared
from suzumio.toolbroker.state import Broker

log = get_logger(__name__)
router = APIRouter()
PASSED_HEADERS = ("content-type", "retry-after", "retry-after-ms", "x-request-id")
MAX_ERROR_BYTES = 1 << 20  # an error answer is read whole, to take the key out of it
# Relayed calls one activation may have open at once: its loop makes one at a time (two with
# a compaction's); more is a sandbox holding the relay's connections from everyone else.
MAX_CALLS_PER_ACTIVATION = 4


@dataclass(frozen=True)
class Upstream:
    base_url: str
    api_key: str | None


class ModelRelay:
    """The relay's one HTTP client (a pool per endpoint), and the default endpoint."""

    def __init__(
        self, default: Upstream | None, read_timeout: float, *, allow_private: bool = False
    ) -> None:
        self.default = default
        self._allow_private = allow_private
        self._open: dict[str, int] = {}  # activation → its relayed calls still open
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(10.0, read=read_timeout, write=60.0),
            limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
            follow_redirects=False,  # the key goes to the endpoint named, nowhere else
        )

    async def check_provider(self, base_url: str, via: str) -> None:
        """A project's provider endpoint, called from the broker's place in the network (not
        the sandbox's): refused (403) when its host resolves to a loopback, private,
        link-local or other non-global address — the platform's own servers, a cloud's
        metadata service — unless the operator allows it (`relay_allow_private_providers`),
        and when it carries a query or a fragment (the relay's path would land in them).
        The platform's default endpoint is the operator's own, and is not checked."""
        parts = urlsplit(base_url)
        if parts.query or parts.fragment:
            raise BrokerError(
                403, "forbidden", f"provider {via!r}: an endpoint with a query is not called"
            )
        if self._allow_private:
            return
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
            infos = await asyncio.get_running_loop().getaddrinfo(
                parts.hostname, port, type=socket.SOCK_STREAM
            )
        except (OSError, ValueError):
            raise BrokerError(
                502, "model_unreachable", f"provider {via!r}: its host does not resolve"
            ) from None
        for *_, sockaddr in infos:
            try:
                reason = refused_reason(ipaddress.ip_address(sockaddr[0]))
            except ValueError:  # a scoped IPv6 address: a link's own
                reason = "link-local"
            if reason is not None:
                raise BrokerError(
                    403,
                    "forbidden",
                    f"provider {via!r}: its endpoint is a {reason} address, which the relay "
                    "calls only where SUZUMIO_RELAY_ALLOW_PRIVATE_PROVIDERS is set",
                )

    def _lease(self, activation_id: str) -> Callable[[], None]:
        """One more open call of the activation's (429 past its share); what ends it, once."""
        held = self._open.get(activation_id, 0)
        if held >= MAX_CALLS_PER_ACTIVATION:
            raise BrokerError(
                429,
                "too_many_requests",
                f"an activation has at most {MAX_CALLS_PER_ACTIVATION} relayed calls open",
                {"Retry-After": "1"},
            )
        self._open[activation_id] = held + 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            left = self._open.pop(activation_id, 1) - 1
            if left > 0:
                self._open[activation_id] = left

        return release

    async def forward(self, upstream: Upstream, body: bytes, caller: Caller, via: str) -> Response:
        release = self._lease(caller.claims.activation_id)
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
        try:
            answer = await self._http.send(
                self._http.build_request("POST", url, content=body, headers=headers), stream=True
            )
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
            try:
                text = await _bounded(answer)
            except httpx.HTTPError:
                text = b""
            finally:
                await answer.aclose()
                release()
            if upstream.api_key:
                text = text.replace(upstream.api_key.encode(), b"***")
            return Response(text, status_code=answer.status_code, headers=passed)

        async def done() -> None:
            release()
            await answer.aclose()

        # Ended by the stream's end or by the runner leaving (either may come first).
        return StreamingResponse(
            _relayed(answer, via, release),
            status_code=answer.status_code,
            headers=passed,
            background=BackgroundTask(done),
        )


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
    answer: httpx.Response, via: str, release: Callable[[], None]
) -> AsyncIterator[bytes]:
    try:
        async for chunk in answer.aiter_raw():
            yield chunk
    except httpx.HTTPError as exc:
        # Raised on: the connection to the runner is then cut, and its SDK sees a broken
        # stream (retried), not an answer that ends early as if it were whole.
        log.warning("model_relay.stream_broken", via=via, error=type(exc).__name__)
        raise
    finally:
        release()
        await answer.aclose()


def _relay(broker: Broker) -> ModelRelay:
    if broker.relay is None:
        raise BrokerError(404, "not_found", "this broker relays no model calls")
    return broker.relay


async def _asked_model(request: Request) -> tuple[bytes, str]:
    body = await request.body()
    try:
        asked = json.loads(body)
    except ValueError:
        raise BrokerError(400, "invalid", "the body is not JSON") from None
    model = asked.get("model") if isinstance(asked, dict) else None
    if not isinstance(model, str):
        raise BrokerError(422, "invalid", "the body names no model")
    return body, model


def _in_chain(chain: tuple[ModelSpec, ...], model: str, provider: str | None) -> bool:
    return any(m.name == model and m.provider == provider for m in chain)


@router.post("/runner/models/default/chat/completions")
async def relay_default(request: Request, caller: Auth, broker: Shared) -> Response:
    """A chat completion of the platform's default endpoint, for the caller's agent."""
    relay = _relay(broker)
    body, model = await _asked_model(request)
    if not _in_chain(await model_chain(broker, caller), model, None):
        raise BrokerError(
            404, "not_found", f"the activation's agent calls no model {model!r} without a provider"
        )
    if relay.default is None:
        raise BrokerError(
            404, "not_found", "this broker has no default model endpoint (SUZUMIO_MODEL_BASE_URL)"
        )
    return await relay.forward(relay.default, body, caller, "default")


@router.post("/runner/models/providers/{name}/chat/completions")
async def relay_provider(
    name: Annotated[str, Path(max_length=100)], request: Request, caller: Auth, broker: Shared
) -> Response:
    """A chat completion of the project's provider `name`, for the caller's agent."""
    relay = _relay(broker)
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
    await relay.check_provider(provider.base_url, name)
    return await relay.forward(Upstream(provider.base_url, api_key or None), body, caller, name)
