"""Errors as RFC 9457 problem details, with a stable `code` clients can switch on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from asyncpg.exceptions import UndefinedTableError
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from suzumio.contracts.errors import HTTP_STATUS, CommandError, CommandTimeoutError
from suzumio.platform.bus.direct_get import DirectGetError
from suzumio.platform.db.trouble import POSTGRES_SUSPECTS, is_postgres_trouble
from suzumio.platform.errors import JetStreamApiError
from suzumio.platform.logging import get_logger
from suzumio.platform.trouble import TROUBLE, is_trouble

log = get_logger(__name__)
PROBLEM_JSON = "application/problem+json"

STATUS_BY_CODE = HTTP_STATUS
CODE_BY_STATUS = {
    400: "invalid",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid",
    429: "rate_limited",
    500: "internal",
    503: "unavailable",
    504: "timeout",
}


class Problem(BaseModel):
    """What every error response carries (RFC 9457)."""

    type: str = Field(default="about:blank")
    title: str
    status: int
    code: str = Field(description="stable machine-readable error code")
    detail: str = ""
    errors: list[dict[str, Any]] | None = Field(default=None, description="per-field errors")


class ApiError(Exception):
    """An error a route raises directly (not from a command)."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code or CODE_BY_STATUS.get(status, "error")
        self.detail = detail
        self.headers = headers
        self.extra = extra


def not_found(what: str) -> ApiError:
    return ApiError(404, f"{what} not found")


def problem_response(
    status: int,
    code: str,
    detail: str,
    *,
    errors: list[dict[str, Any]] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    title = {
        404: "Not Found",
        409: "Conflict",
        422: "Unprocessable Content",
        401: "Unauthorized",
        403: "Forbidden",
        413: "Content Too Large",
        503: "Service Unavailable",
        504: "Gateway Timeout",
        500: "Internal Server Error",
    }.get(status, "Error")
    body = Problem(title=title, status=status, code=code, detail=detail, errors=errors)
    return JSONResponse(
        body.model_dump(exclude_none=True),
        status_code=status,
        media_type=PROBLEM_JSON,
        headers=headers,
    )


FATE_UNKNOWN = "command_fate_unknown"  # a request-state flag the idempotency layer reads


async def _command_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, CommandError)
    if isinstance(exc, CommandTimeoutError):
        # Nobody knows whether the command ran (its service may have died holding it): an
        # answer to keep for an Idempotency-Key would keep a retry from ever finding out.
        setattr(request.state, FATE_UNKNOWN, True)
    errors = exc.details.get("errors") if isinstance(exc.details.get("errors"), list) else None
    return problem_response(
        STATUS_BY_CODE.get(exc.code, 500), exc.code.value, exc.message, errors=errors
    )


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return problem_response(exc.status, exc.code, exc.detail, headers=exc.headers)


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = CODE_BY_STATUS.get(exc.status_code, "error")
    return problem_response(exc.status_code, code, str(exc.detail), headers=exc.headers)


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {
            "loc": ".".join(str(p) for p in e.get("loc", ())),
            "msg": e.get("msg", ""),
            "type": e.get("type", ""),
        }
        for e in exc.errors()
    ]
    return problem_response(422, "invalid", "the request is not valid", errors=errors)


async def _model_error(_: Request, exc: Exception) -> JSONResponse:
    """A value that passed the request schema but not a command's (e.g. an id's syntax)."""
    assert isinstance(exc, ValidationError)
    errors = [
        {"loc": ".".join(str(p) for p in e["loc"]), "msg": e["msg"], "type": e["type"]}
        for e in exc.errors(include_url=False, include_input=False)
    ]
    return problem_response(422, "invalid", "the request is not valid", errors=errors)


# The platform's servers in trouble while a request ran (a Postgres connection cut or
# refused, the server restarting or short of resources; NATS reconnecting or slow): the request
# was fine and may pass in a moment, so it is a 503 to send again, not a 500 (the gateway's own
# failure) — and, handled here rather than as any exception, no traceback in the error log.
# Not every OSError (a file the gateway failed to spool is its own failure): Postgres's
# ConnectionError, and a timeout.
RETRY_AFTER_SECONDS = 1


async def _jetstream_error(request: Request, exc: Exception) -> JSONResponse:
    if is_trouble(exc):
        return unavailable(request.url.path, exc)
    raise exc


def unavailable(path: str, exc: BaseException) -> JSONResponse:
    log.warning("api.unavailable", path=path, error=repr(exc))
    return problem_response(
        503,
        "unavailable",
        "the platform is briefly unavailable; retry",
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
    return unavailable(request.url.path, exc)


async def _postgres_suspect(request: Request, exc: Exception) -> JSONResponse:
    """asyncpg's client-side errors: trouble when they are a lost connection; otherwise a bug
    of ours (a connection used by two tasks at once, after its release), which a 503 would
    hide behind retries for good: raised on, to be answered as any failure (500, logged
    with its traceback, no answer kept for an Idempotency-Key)."""
    if is_postgres_trouble(exc):
        return await _unavailable(request, exc)
    raise exc


async def _relation_missing(request: Request, exc: Exception) -> JSONResponse:
    """A read model's table not there (yet): on a platform's first start the session
    service's projector makes them a moment after the gateway is up, and a rebuild swaps them
    in — a 503 to send again. Any other relation missing is a bug of ours: raised on."""
    if 'relation "proj_' in str(exc):
        return await _unavailable(request, exc)
    raise exc


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("api.unexpected_error", path=request.url.path, exc_info=exc)
    return problem_response(500, "internal", "the request failed unexpectedly")


HANDLERS = {
    **dict.fromkeys(TROUBLE, _unavailable),
    **dict.fromkeys(POSTGRES_SUSPECTS, _postgres_suspect),
    JetStreamApiError: _jetstream_error,
    DirectGetError: _jetstream_error,
    UndefinedTableError: _relation_missing,
    CommandError: _command_error,
    ApiError: _api_error,
    StarletteHTTPException: _http_error,
    RequestValidationError: _validation_error,
    ValidationError: _model_error,
    Exception: _unexpected,
}

# Documented on every route, so the OpenAPI document says what errors look like.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": Problem, "description": desc, "content": {PROBLEM_JSON: {}}}
    for status, desc in {
        401: "missing or invalid API key",
        403: "not allowed",
        404: "not found (or not yours)",
        409: "conflicts with the current state",
        413: "too large",
        422: "invalid request",
        503: "a service is unavailable",
        504: "timed out",
    }.items()
}
