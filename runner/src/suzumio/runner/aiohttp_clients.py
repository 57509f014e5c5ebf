"""The broker client a resident runner keeps, on aiohttp (the `aiohttp` extra; imported only
with it, see `connections`).

`httpx-aiohttp`'s transport maps aiohttp's common failures to httpx's transport errors, which
the broker client retries, but leaves others as they are: a malformed answer or an over-long
header line (`aiohttp.ClientResponseError`) would reach the runner as a crash instead of a
broker that could not be understood. Here every aiohttp failure of a request or of reading its
answer is an httpx transport error. The client builds its transports as httpx's own client
does, so proxies from the environment (`HTTP(S)_PROXY`, `NO_PROXY`) still apply.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

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
        return _Transport(verify=verify, trust_env=trust_env, limits=limits)

    def _init_proxy_transport(  # type: ignore[override]
        self,
        proxy: httpx.Proxy,
        verify: ssl.SSLContext | str | bool = True,
        trust_env: bool = True,
        limits: httpx.Limits = DEFAULT_LIMITS,
        **_: Any,
    ) -> httpx.AsyncBaseTransport:
        return _Transport(verify=verify, trust_env=trust_env, limits=limits, proxy=proxy)
