"""The broker client a resident runner keeps, on aiohttp (the `aiohttp` extra; imported only
with it, see `connections`).

`httpx-aiohttp`'s transport maps aiohttp's common failures to httpx's transport errors, which
the broker client retries, but leaves others as they are: a malformed answer or an over-long
header line (`aiohttp.ClientResponseError`) would reach the runner as a crash instead of a
broker that could not be understood. Here every aiohttp failure of a request or of reading its
answer is an httpx transport error. The client builds its transports as httpx's own client
does, so proxies from the environment (`HTTP(S)_PROXY`, `NO_PROXY`) still apply.

A plain request (a body of bytes or none, no proxy in the environment) — every broker call
of an activation but file transfers — goes to the direct transport's aiohttp session
without httpx's request and response machinery around it, which cost more CPU than the
request itself; its answer is read whole into an `httpx.Response`, its failures are the same
httpx transport errors.
"""

from __future__ import annotations

import contextlib
import ssl
import urllib.request
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport
from httpx_aiohttp.transport import map_aiohttp_exceptions

DEFAULT_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20)


class _Answer(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream) -> None:
        self._inner = inner

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                yield chunk
        except aiohttp.ClientError as exc:
            raise httpx.ReadError(str(exc)) from exc

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        except aiohttp.ClientError as exc:
            raise httpx.ReadError(str(exc)) from exc


@contextlib.contextmanager
def _transport_errors() -> Iterator[None]:
    """Every aiohttp failure as an httpx transport error: `map_aiohttp_exceptions`'s finer
    mapping where it has one, else a protocol error (a timeout: a read timeout)."""
    try:
        with map_aiohttp_exceptions():
            yield
    except aiohttp.ClientError as exc:
        raise httpx.RemoteProtocolError(str(exc)) from exc
    except TimeoutError as exc:
        raise httpx.ReadTimeout(str(exc) or "timed out") from exc


class _Transport(AiohttpTransport):
    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await super().handle_async_request(request)
        except aiohttp.ClientError as exc:  # those the transport leaves unmapped
            raise httpx.RemoteProtocolError(str(exc), request=request) from exc
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _Answer(response.stream)
        return response


class KeptBrokerClient(httpx.AsyncClient):
    """An httpx client whose transports (the direct one and each proxy's) are aiohttp's."""

    _direct: _Transport | None = None  # the transport of calls no proxy takes
    _plain = True  # no proxy in the environment: plain calls go straight to its session
    _base_text = ""

    def _init_transport(  # type: ignore[override]
        self,
        verify: ssl.SSLContext | str | bool = True,
        trust_env: bool = True,
        limits: httpx.Limits = DEFAULT_LIMITS,
        transport: httpx.AsyncBaseTransport | None = None,
        **_: Any,
    ) -> httpx.AsyncBaseTransport:
        if transport is not None:
            return transport
        self._direct = _Transport(verify=verify, trust_env=trust_env, limits=limits)
        if trust_env and urllib.request.getproxies_environment():
            self._plain = False  # a proxy may apply: httpx chooses the transport
        return self._direct

    def _base(self) -> str:
        """The base URL as text, ending in `/`."""
        if not self._base_text:
            self._base_text = str(self.base_url).rstrip("/") + "/"
        return self._base_text

    async def request(  # type: ignore[override]
        self,
        method: str,
        url: httpx.URL | str,
        *,
        content: bytes | AsyncIterator[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, Any] | None = None,
        timeout: Any = httpx.USE_CLIENT_DEFAULT,
        **kwargs: Any,
    ) -> httpx.Response:
        if (
            self._direct is None
            or not self._plain
            or kwargs
            or not isinstance(url, str)
            or not (content is None or isinstance(content, bytes))
        ):
            return await super().request(
                method, url, content=content, headers=headers, params=params, timeout=timeout,
                **kwargs,
            )  # fmt: skip
        return await self._plain_request(method, url, content, headers, params, timeout)

    async def _plain_request(
        self,
        method: str,
        path: str,
        content: bytes | None,
        headers: Mapping[str, str] | None,
        params: Mapping[str, Any] | None,
        timeout: Any,
    ) -> httpx.Response:
        assert self._direct is not None
        if not isinstance(self._direct.client, aiohttp.ClientSession):
            self._direct.client = self._direct.get_client()
        chosen = self.timeout if timeout is httpx.USE_CLIENT_DEFAULT else timeout
        limits = chosen if isinstance(chosen, httpx.Timeout) else httpx.Timeout(chosen)
        with _transport_errors():
            async with self._direct.client.request(
                method,
                f"{self._base()}{path[1:]}" if path.startswith("/") else path,
                params=params,
                headers=headers,
                data=content,
                allow_redirects=False,
                auto_decompress=False,  # as the transport: httpx decodes what it reads
                timeout=aiohttp.ClientTimeout(
                    sock_connect=limits.connect, sock_read=limits.read, connect=limits.pool
                ),
            ) as answer:
                body = await answer.read()
        return httpx.Response(answer.status, headers=answer.raw_headers, content=body)

    def _init_proxy_transport(  # type: ignore[override]
        self,
        proxy: httpx.Proxy,
        verify: ssl.SSLContext | str | bool = True,
        trust_env: bool = True,
        limits: httpx.Limits = DEFAULT_LIMITS,
        **_: Any,
    ) -> httpx.AsyncBaseTransport:
        return _Transport(verify=verify, trust_env=trust_env, limits=limits, proxy=proxy)
