"""A watch the Kubernetes API server refuses (401/403), against the FAKE Kubernetes API server
(`suzumio.testing.fake_kubernetes`; no cluster exists here, DESIGN.md §13).

A lasting refusal (a revoked token, RBAC that lost `jobs` or `pods`) was retried every ≤10 s
until the activation's wall clock ended it as `timed_out`: the cause showed nowhere but a
warning log. Now `health` reports it at once, and after `refused_give_up_seconds` the watch
ends as lost with the API server's own words, not retryable; a refusal that goes away before
that is ridden out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest_asyncio
from starlette.requests import Request
from starlette.responses import Response

from suzumio.contracts.ids import new_id
from suzumio.orchestrator.backends.kubernetes import KubernetesBackend, KubernetesSettings
from suzumio.testing.fake_kubernetes import ApiError, FakeKubernetesServer
from tests.unit.test_kubernetes_render import make_plan

NS = "sandboxes"
FORBIDDEN = (
    'jobs.batch "x" is forbidden: User "system:serviceaccount:suzumio:orchestrator" '
    'cannot get resource "jobs" in API group "batch" in the namespace "sandboxes"'
)


class Refusing:
    """Answers 403 to every request about Jobs or pods while `on` (the namespace and
    `/version` stay readable: RBAC that lost only these)."""

    def __init__(self, server: FakeKubernetesServer, *, watches_only: bool = False) -> None:
        self.on = False
        self.refused = 0
        route: Callable[[Request, dict[str, str]], Awaitable[Response]] = server._route

        async def refusing(request: Request, query: dict[str, str]) -> Response:
            about = any(p in request.url.path for p in ("/jobs", "/pods"))
            if self.on and about and (not watches_only or query.get("watch") == "True"):
                self.refused += 1
                raise ApiError(403, "Forbidden", FORBIDDEN)
            return await route(request, query)

        server._route = refusing  # type: ignore[method-assign]


@pytest_asyncio.fixture
async def server() -> AsyncIterator[FakeKubernetesServer]:
    async with FakeKubernetesServer(namespaces=[NS, "default"]) as fake:
        yield fake


def backend_for(server: FakeKubernetesServer, give_up_after: float) -> KubernetesBackend:
    settings = KubernetesSettings(
        namespace=NS, image="suzumio/runner:test", api_url=server.url, watch_timeout_seconds=5
    )
    backend = KubernetesBackend(settings, f"t{new_id()[-12:]}")
    backend.refused_give_up_seconds = give_up_after
    return backend


async def test_a_lasting_403_ends_the_watch_with_its_cause_fake_api_server(
    server: FakeKubernetesServer,
) -> None:
    refusing = Refusing(server)
    backend = backend_for(server, give_up_after=2.0)
    try:
        handle = await backend.launch(make_plan(namespace=backend.namespace))
        refusing.on = True
        exit_ = await asyncio.wait_for(backend.watch(handle), 20)
        assert exit_.reason == "lost"
        assert exit_.code is None
        assert exit_.retryable is False  # its pod may still run: no second attempt beside it
        assert "403" in exit_.detail
        assert "cannot get resource" in exit_.detail
        assert refusing.refused >= 2  # retried before giving up
        assert (await backend.health()).ok  # the watch is over: nothing refused any more
    finally:
        await backend.close()


async def test_a_short_403_is_reported_by_health_and_ridden_out_fake_api_server(
    server: FakeKubernetesServer,
) -> None:
    refusing = Refusing(server)
    backend = backend_for(server, give_up_after=600.0)
    try:
        handle = await backend.launch(make_plan(namespace=backend.namespace))
        refusing.on = True
        watch = asyncio.create_task(backend.watch(handle))
        for _ in range(200):
            health = await backend.health()
            if not health.ok:
                break
            await asyncio.sleep(0.05)
        assert not health.ok
        assert handle.sandbox_id in health.detail["error"]
        assert "403" in health.detail["error"]
        assert not watch.done()

        refusing.on = False  # the role is fixed
        server.finish_job(handle.sandbox_id, exit_code=0)
        exit_ = await asyncio.wait_for(watch, 20)
        assert (exit_.code, exit_.reason) == (0, "exited")
        assert (await backend.health()).ok
    finally:
        await backend.close()


async def test_a_refused_watch_verb_alone_falls_back_to_polling_fake_api_server(
    server: FakeKubernetesServer,
) -> None:
    """RBAC without `watch` but with `get`/`list`: polling still sees the Job's end, so that is
    reported (health) but not given up on, however long it lasts."""
    refusing = Refusing(server, watches_only=True)
    backend = backend_for(server, give_up_after=0.5)
    try:
        handle = await backend.launch(make_plan(namespace=backend.namespace))
        refusing.on = True
        watch = asyncio.create_task(backend.watch(handle))
        await asyncio.sleep(3)  # well past the give-up time
        assert not watch.done()
        assert refusing.refused >= 2
        health = await backend.health()
        assert not health.ok
        assert "403" in health.detail["error"]
        server.finish_job(handle.sandbox_id, exit_code=0)
        exit_ = await asyncio.wait_for(watch, 20)
        assert (exit_.code, exit_.reason) == (0, "exited")
    finally:
        await backend.close()
