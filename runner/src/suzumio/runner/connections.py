"""The runner's HTTP clients, and those a resident runner keeps across its activations.

A resident runner (forked by the fork server for a warm session) keeps one broker client per
broker URL and one model client per endpoint and key (`Connections`), on its one event loop,
so an activation after the first reuses their pools (open connections, no new client) instead
of building and tearing them down. Where the `aiohttp` extra is installed (`suzumio-runner
[aiohttp]`: pool workers), the kept clients go over aiohttp, whose parser and writer are C: the
default httpx transport (httpcore with h11 on anyio) spent about twice the CPU per request,
most of a no-op activation's. The model's is then the SDK's own `DefaultAioHttpClient`, the
broker's an httpx client on the `httpx-aiohttp` transport (`aiohttp_clients`): the callers keep
httpx's API and its errors (aiohttp's failures become httpx's transport errors, which both
clients retry), and proxies from the environment apply as they do to httpx's own clients.
One difference stays: aiohttp refuses an answer's header line over 8 KB (httpx, a header block
over 16 KB), a transport error for the loop.

A runner that runs one activation (`run`: the process, docker and kubernetes backends) makes
its own two clients on httpx's default transport and closes them with it: for two requests,
importing aiohttp (~90 ms; the SDK imports it whenever it is installed) would cost more than it
saves, so the runner image goes without the extra.

A kept broker client holds no credential: each activation's token goes with each of its
requests (`BrokerClient`), never into the client's defaults. A kept model client holds its
endpoint's key, which comes from the runner's environment: the worker gives a resident runner
only activations of that same environment, and retires it for another.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import httpx
import httpx2
import openai
from openai._models import FinalRequestOptions

from suzumio.runner import tls

# Under the servers' idle timeout (uvicorn's is 5 s), so a kept connection is rarely one the
# server is closing at that very moment (a retried transport error, if it is).
KEEPALIVE_SECONDS = 4.0
AIOHTTP = all(importlib.util.find_spec(m) is not None for m in ("aiohttp", "httpx_aiohttp"))


def broker_http(
    base_url: str, timeout: float, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    """A client for one broker, on httpx's own transport unless `transport` is given."""
    return httpx.AsyncClient(
        base_url=base_url.rstrip("/"),
        timeout=timeout,
        verify=tls.CONTEXT,
        transport=transport,
        limits=httpx.Limits(keepalive_expiry=KEEPALIVE_SECONDS),
    )


def kept_broker_http(base_url: str, timeout: float) -> httpx.AsyncClient:
    """A broker client to keep: on aiohttp where the extra is installed."""
    if not AIOHTTP:
        return broker_http(base_url, timeout)
    from suzumio.runner.aiohttp_clients import KeptBrokerClient  # noqa: PLC0415 - the extra

    return KeptBrokerClient(
        base_url=base_url.rstrip("/"),
        timeout=timeout,
        verify=tls.CONTEXT,
        limits=httpx.Limits(keepalive_expiry=KEEPALIVE_SECONDS),
    )


def broker_socket(path: str) -> httpx.AsyncHTTPTransport:
    """httpx's own transport over the broker's Unix socket (network `none`: the only way out
    of the sandbox), for the broker client."""
    return httpx.AsyncHTTPTransport(
        uds=path, limits=httpx.Limits(keepalive_expiry=KEEPALIVE_SECONDS)
    )


def model_http(*, kept: bool = False, socket: str | None = None) -> openai.DefaultAsyncHttpxClient:
    """A client for model endpoints (the SDK's own type; it keeps a pool per host); one to
    keep is on aiohttp where the extra is installed; with `socket`, every request goes
    through the broker's Unix socket (its model relay)."""
    if socket is not None:  # the SDK's client is on httpx2, so is its transport
        limits = httpx2.Limits(keepalive_expiry=KEEPALIVE_SECONDS)
        return openai.DefaultAsyncHttpxClient(
            transport=httpx2.AsyncHTTPTransport(uds=socket, limits=limits)
        )
    if kept and AIOHTTP:
        return openai.DefaultAioHttpClient(verify=tls.CONTEXT)
    return openai.DefaultAsyncHttpxClient(verify=tls.CONTEXT)


class Connections:
    def __init__(self) -> None:
        self._broker: dict[str, httpx.AsyncClient] = {}
        self._model: openai.DefaultAsyncHttpxClient | None = None
        self._sdk: dict[tuple[str | None, str, float], openai.AsyncOpenAI] = {}

    def broker(self, base_url: str, timeout: float) -> httpx.AsyncClient:
        client = self._broker.get(base_url)
        if client is None:
            client = self._broker[base_url] = kept_broker_http(base_url, timeout)
        return client

    def model(self) -> openai.DefaultAsyncHttpxClient:
        """For every model endpoint. A kept connection the server closed meanwhile is a
        transport error the loop retries."""
        if self._model is None:
            self._model = model_http(kept=True)
        return self._model

    def sdk(self, base_url: str | None, api_key: str, timeout: float) -> openai.AsyncOpenAI:
        """The SDK's client of one endpoint and key, on the kept `model` client: building one
        (its options, headers and auth) cost about a tenth of an activation's CPU."""
        key = (base_url, api_key, timeout)
        client = self._sdk.get(key)
        if client is None:
            client = self._sdk[key] = sdk_client(base_url, api_key, timeout, self.model())
        return client

    async def aclose(self) -> None:
        for client in self._broker.values():
            await client.aclose()
        if self._model is not None:
            await self._model.aclose()
        self._broker.clear()
        self._sdk.clear()
        self._model = None


_PER_REQUEST = frozenset({b"content-length", b"cookie"})


@dataclass(frozen=True, slots=True)
class _Template:
    """A request of the SDK's, but its body (`_SdkClient._build_request`); made with `base`
    as the base URL and `key` as the API key."""

    base: httpx2.URL
    key: str
    method: str
    url: httpx2.URL
    headers: list[tuple[bytes, bytes]]
    extensions: dict[str, Any]


# Looked up once per process (the fork server's runners inherit it); see `sdk_client`.
PLATFORM = openai._base_client.get_platform()


class _SdkClient(openai.AsyncOpenAI):
    """The SDK's client, making the URL of a path once (it parsed the path and copied its base
    URL with it on every request: 2% of a resident runner's CPU), and the rest of a request
    but its body once for each kind of request (`_build_request`)."""

    def _build_request(
        self, options: FinalRequestOptions, *, retries_taken: int = 0
    ) -> httpx2.Request:
        """The SDK's request for `options`: for a body given as bytes, and nothing else that
        changes from call to call, its request of the first such call with the body put in.
        The SDK merged its headers (auth, its own, the HTTP client's), parsed the URL it had
        made, and normalized every header again on each call: a fifth of a model call's CPU
        (~140 µs). Cookies the HTTP client has kept since go with each request, as the SDK
        adds them; anything else (JSON, files, query parameters, headers of the call's own, an
        idempotency key) goes the SDK's own way every time."""
        content = options.content
        if (
            type(content) is not bytes
            or options.json_data is not None
            or options.extra_json is not None
            or options.files is not None
            or options.params
            or options.headers
            or self.default_query
            or self._idempotency_header
            or self._auth_query(options.security)
        ):
            return super()._build_request(options, retries_taken=retries_taken)
        made: dict[tuple[object, ...], _Template] = self.__dict__.setdefault("_templates", {})
        key: tuple[object, ...] = (options.method, options.url, retries_taken)
        key += (repr(options.timeout), repr(options.security))  # dicts, or a Timeout
        template = made.get(key)
        if template is None or template.base is not self.base_url or template.key != self.api_key:
            # Made with an empty body, whose length is dropped, and the cookies of the moment,
            # dropped too: each request takes the client's cookies as they are by then (a
            # `Cookie` header already there would keep the ones of this moment for good).
            first = super()._build_request(
                options.model_copy(update={"content": b""}), retries_taken=retries_taken
            )
            headers = [(k, v) for k, v in first.headers.raw if k.lower() not in _PER_REQUEST]
            template = made[key] = _Template(
                self.base_url, self.api_key, first.method, first.url, headers, first.extensions
            )
        return httpx2.Request(
            template.method,
            template.url,
            headers=template.headers,
            cookies=self._client.cookies or None,
            content=content,
            extensions=dict(template.extensions),
        )

    def _prepare_url(self, url: str) -> httpx2.URL:
        urls: dict[str, tuple[httpx2.URL, httpx2.URL]] = self.__dict__.setdefault("_urls", {})
        base = self.base_url
        made = urls.get(url)
        if made is None or made[0] is not base:  # the base URL may be set again
            made = urls[url] = (base, super()._prepare_url(url))
        return made[1]


def sdk_client(
    base_url: str | None, api_key: str, timeout: float, http: openai.DefaultAsyncHttpxClient
) -> openai.AsyncOpenAI:
    """The SDK's own retries are off: the loop classifies failures and decides (DESIGN.md
    Appendix A), so retries are counted in one place."""
    client = _SdkClient(
        base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout, http_client=http
    )
    # The SDK looks the platform up on a client's first request in a worker thread; the
    # thread (and joining it when the loop ends) costs a short-lived runner milliseconds.
    if getattr(client, "_platform", "absent") is None:
        client._platform = PLATFORM
    return client
