"""The broker's errors: RFC 9457 problem bodies a runner can act on (the gateway's shape)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from nats.errors import MaxPayloadError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from suzumio.contracts.errors import HTTP_STATUS, CommandError
from suzumio.platform.bus.eventstore import ConcurrencyConflictError
from suzumio.platform.bus.trouble import NATS_TROUBLE
from suzumio.platform.db.trouble import POSTGRES_SUSPECTS, POSTGRES_TROUBLE, is_postgres_trouble
from suzumio.platform.errors import JetStreamApiError, PlatformError
from suzumio.platform.logging import get_logger

log = get_logger(__name__)
PROBLEM_JSON = "application/problem+json"
RETRY_AFTER_SECONDS = 1
_STATUS = HTTP_STATUS
_CODE = {400: "invalid", 401: "unauthenticated", 403: "forbidden", 404: "not_found"}

# The platform's servers in trouble (NATS down, restarting or slow; Postgres unreachable): the
# request was fine and may succeed in a moment, so the runner is told to retry (503), never that
# it was refused — a 4xx would make it give up on work it still has to deliver. (OSError
# covers TimeoutError, nats' TimeoutError included.)
UNAVAILABLE: tuple[type[Exception], ...] = (
    *POSTGRES_TROUBLE,
    OSError,
    *NATS_TROUBLE,
    ConcurrencyConflictError,  # the broker's own writes kept losing races: try again
)


class BrokerError(Exception):
    def __init__(
        self, status: int, code: str, detail: str, headers: Mapping[str, str] | None = None
    ) -> None:
        """`headers`: of the answer (a 429's Retry-After)."""
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail
        self.headers = dict(headers or {})


def problem(
    status: int,
    code: str,
    detail: str,
    errors: list[Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {"type": "about:blank", "title": code, "status": status, "code": code}
    body["detail"] = detail
    if errors:
        body["errors"] = errors
    sent = dict(headers or {})
    if status == 401:
        sent.setdefault("WWW-Authenticate", "Bearer")
    elif status == 503:
        sent.setdefault("Retry-After", str(RETRY_AFTER_SECONDS))
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=sent or None)


async def _broker(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, BrokerError)
    return problem(exc.status, exc.code, exc.detail, headers=exc.headers)


async def _command(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, CommandError)
    return problem(_STATUS.get(exc.code, 500), exc.code.value, exc.message)


async def _http(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return problem(exc.status_code, _CODE.get(exc.status_code, "error"), str(exc.detail))


async def _validation(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"loc": ".".join(str(p) for p in e.get("loc", ())), "msg": e.get("msg", "")}
        for e in exc.errors()
    ]
    return problem(422, "invalid", "the request is not valid", errors)


async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
    log.warning("broker.unavailable", path=request.url.path, error=repr(exc))
    return problem(503, "unavailable", "the platform is briefly unavailable; retry")


async def _postgres_suspect(request: Request, exc: Exception) -> JSONResponse:
    # asyncpg's client-side errors are a bug of ours unless they are a lost connection: a 503
    # would have the runner retry one for good.
    if is_postgres_trouble(exc):
        return await _unavailable(request, exc)
    return await _unexpected(request, exc)


async def _platform(request: Request, exc: Exception) -> JSONResponse:
    # The platform's mechanisms fail this way when a server is in trouble (a direct get
    # answered 503 while a stream has no leader); a JetStream refusal of the request itself
    # (a 4xx) is not a blip.
    if isinstance(exc, JetStreamApiError) and exc.code < 500 and exc.code != 408:
        return await _unexpected(request, exc)
    return await _unavailable(request, exc)


async def _too_large(_: Request, __: Exception) -> JSONResponse:
    # nats-py refuses a message over the server's max_payload before publishing it: nothing
    # was sent, and the same request would be refused again — the caller must send less.
    return problem(413, "too_large", "the request is too large to pass on; send less")


async def _disconnected(request: Request, _: Exception) -> JSONResponse:
    # Nobody reads this answer; it keeps a client gone mid-body out of the error log.
    log.info("broker.client_disconnected", path=request.url.path)
    return problem(400, "invalid", "the request body ended early")


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("broker.unexpected_error", path=request.url.path, exc_info=exc)
    return problem(500, "internal", "the request failed unexpectedly")


HANDLERS: dict[type[Exception], Any] = {
    BrokerError: _broker,
    **dict.fromkeys(UNAVAILABLE, _unavailable),  # before CommandError: a conflict of ours is one
    **dict.fromkeys(POSTGRES_SUSPECTS, _postgres_suspect),
    PlatformError: _platform,
    MaxPayloadError: _too_large,
    ClientDisconnect: _disconnected,
    CommandError: _command,
    StarletteHTTPException: _http,
    RequestValidationError: _validation,
    Exception: _unexpected,
}
