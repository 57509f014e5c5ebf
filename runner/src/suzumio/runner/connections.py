"""HTTP clients a resident runner keeps across its activations: one per broker URL and one per
model endpoint, on its one event loop, so an activation after the first reuses their pools
(open connections, no new client) instead of building and tearing them down.

A runner that runs one activation (`run`) has none: its clients live and die with it. Only
clients are kept — a client holds no credential here: the broker's token and a model's key
go with each request (`BrokerClient`, `ModelClient`), never into a shared client's defaults.
"""

from __future__ import annotations

import httpx
import openai

from suzumio.runner import tls

# Under the servers' idle timeout (uvicorn's is 5 s), so a kept connection is rarely one the
# server is closing at that very moment (a retried transport error, if it is).
KEEPALIVE_SECONDS = 4.0


class Connections:
    def __init__(self) -> None:
        self._broker: dict[str, httpx.AsyncClient] = {}
        self._model: openai.DefaultAsyncHttpxClient | None = None

    def broker(self, base_url: str, timeout: float) -> httpx.AsyncClient:
        client = self._broker.get(base_url)
        if client is None:
            client = self._broker[base_url] = httpx.AsyncClient(
                base_url=base_url.rstrip("/"),
                timeout=timeout,
                verify=tls.CONTEXT,
                limits=httpx.Limits(keepalive_expiry=KEEPALIVE_SECONDS),
            )
        return client

    def model(self) -> openai.DefaultAsyncHttpxClient:
        """For every model endpoint (the SDK's own client type; it keeps a pool per host). A
        kept connection the server closed meanwhile is a transport error the loop retries."""
        if self._model is None:
            self._model = openai.DefaultAsyncHttpxClient(verify=tls.CONTEXT)
        return self._model

    async def aclose(self) -> None:
        for client in self._broker.values():
            await client.aclose()
        if self._model is not None:
            await self._model.aclose()
        self._broker.clear()
        self._model = None
