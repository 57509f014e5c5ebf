"""The FastAPI application: routers, problem handlers, the idempotency middleware."""

from __future__ import annotations

import re
from collections.abc import Sequence

from fastapi import FastAPI
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from suzumio.gateway.api.deps import still_allowed
from suzumio.gateway.api.idempotency import MAX_BUFFERED_BODY, IdempotencyMiddleware
from suzumio.gateway.api.problems import HANDLERS, ApiError
from suzumio.gateway.api.routes import (
    agents,
    artifacts,
    cluster,
    mounts,
    pending_actions,
    projects,
    sessions,
    stream,
    users,
)
from suzumio.gateway.state import Gateway
from suzumio.platform.service.bodylimit import BodyLimit, BodyLimits

ROUTERS = (
    users.router,
    projects.router,
    mounts.router,
    agents.router,
    sessions.router,
    stream.router,
    artifacts.router,
    pending_actions.router,
    cluster.router,
)

DESCRIPTION = """\
The public API of Suzumio, a control plane for LLM agents.

* **Auth**: every call carries an API key: `Authorization: Bearer szm_...` (or `X-API-Key`).
* **Errors** are `application/problem+json` with a stable `code`.
* **Not yours = not there**: an object of a project you are not a member of answers 404.
* **Idempotency**: send `Idempotency-Key` with any POST; a retry gets the first answer.
* **Read your writes**: writes answer with a `Suzumio-Position` header; pass it back as
  `?min_position=` (or `Suzumio-Min-Position`) and the read waits until it is reflected.
* **Lists** are paged: `?limit=&cursor=`, answered with `{items, next_cursor}`.
"""


# Uploads stream: their parts are spooled and bounded one by one as they arrive (uploads.py).
_STREAMED = re.compile(r"/v1/projects/[^/]+/(?:artifacts|agents/import)|/v1/agents/[^/]+/package")
MAX_BODY_BYTES = MAX_BUFFERED_BODY  # far more than the bus carries in one command anyway


class BoundedBodies:
    """Every other body is read whole by FastAPI before any dependency runs, the key check
    among them: without a bound, anyone who reaches the port makes the gateway hold as much
    as they send. Such bodies past `MAX_BODY_BYTES` are refused (413) as they arrive."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app
        self._bounded = BodyLimit(app, BodyLimits(MAX_BODY_BYTES))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streamed = scope["type"] == "http" and scope["method"] == "POST"
        if streamed and _STREAMED.fullmatch(scope["path"]):
            await self._app(scope, receive, send)
        else:
            await self._bounded(scope, receive, send)


def create_app(gateway: Gateway, extra_routes: Sequence[BaseRoute]) -> FastAPI:
    app = FastAPI(
        title="Suzumio API",
        version="0.1.0",
        description=DESCRIPTION,
        exception_handlers=HANDLERS,  # type: ignore[arg-type]
        # As the tool-broker's: request spans and metrics, not a span per dependency.
        telemetry={"operation_spans": False, "logs": False},
    )
    app.state.gateway = gateway
    for router in ROUTERS:
        app.include_router(router)
    app.router.routes.extend(extra_routes)
    app.add_middleware(
        IdempotencyMiddleware,
        kv=lambda: app.state.gateway.idempotency,
        box=lambda: app.state.gateway.secrets,
        valid_key=lambda key: _still_valid(app, key),
    )
    app.add_middleware(BoundedBodies)  # added last: outermost, before the idempotency buffer
    return app


async def _still_valid(app: FastAPI, key: str) -> bool | None:
    """Whether `key` opens anything now, read afresh (a replay is rare; a key revoked on
    another gateway a moment ago must not get its answers) — and asked of the log while the
    keys' read model is frozen, as a route's check does. None: it cannot be told now."""
    if not key:
        return False
    try:
        await still_allowed(app.state.gateway, key)
    except ApiError as exc:
        return False if exc.status == 401 else None
    return True
