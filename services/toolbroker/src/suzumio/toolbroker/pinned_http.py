"""An httpx client whose connections to a checked name go to the addresses that were checked,
never to what the name resolves to by the time it connects (DNS rebinding).

The pin is made below the connection pool, in httpcore's network backend, not by putting the
IP in the URL: the URL keeps the name, so the pool keys its connections by the name (a
connection whose certificate was verified for one provider is never reused for another that
shares its IP), the Host header is the name's, and TLS sends and verifies the name. The pin
is the calling task's (a context variable around the request), so concurrent calls each
connect by their own check. Proxies from the environment are not used: a proxy would resolve
the name itself, past the check.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterable, Iterator
from contextvars import ContextVar

import httpcore
import httpx

from suzumio.contracts.addresses import IPAddress

_PIN: ContextVar[tuple[str, tuple[IPAddress, ...]] | None] = ContextVar("pin", default=None)


@contextlib.contextmanager
def pinned(host: str, addresses: tuple[IPAddress, ...]) -> Iterator[None]:
    """Within this block, a connection this task opens to `host` goes to `addresses`, in
    order (the next when one cannot be connected to)."""
    token = _PIN.set((host.lower(), addresses))
    try:
        yield
    finally:
        _PIN.reset(token)


class _PinningBackend(httpcore.AsyncNetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        pin = _PIN.get()
        if pin is None or pin[0] != host.lower():
            return await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        failure: Exception | None = None
        for address in pin[1]:
            try:
                return await self._inner.connect_tcp(
                    str(address), port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        raise failure or httpcore.ConnectError(f"{host}: no address to connect to")

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return await self._inner.connect_unix_socket(path, timeout, socket_options)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _PinningTransport(httpx.AsyncHTTPTransport):
    def __init__(self, limits: httpx.Limits, verify: ssl.SSLContext | bool) -> None:
        super().__init__(limits=limits, verify=verify)
        # The pool httpx would make, connecting through the pinning backend.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_PinningBackend(),
        )


def pinning_client(
    timeout: httpx.Timeout, limits: httpx.Limits, verify: ssl.SSLContext | bool = True
) -> httpx.AsyncClient:
    """A client for `pinned` calls; redirects are not followed (a key goes to the endpoint
    named, nowhere else)."""
    return httpx.AsyncClient(
        timeout=timeout,
        transport=_PinningTransport(limits, verify),
        follow_redirects=False,
        trust_env=False,
    )
