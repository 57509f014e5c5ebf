"""The broker's errors: RFC 9457 problem bodies a runner can act on (the gateway's shape)."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from suzumio.contracts.errors import HTTP_STATUS, CommandError
from suzumio.platform.logging import get_logger

log = get_logger(__name__)
PROBLEM_JSON = "application/problem+json"
_STATUS = HTTP_STATUS
_CODE = {400: "invalid", 401: "unauthenticated", 403: "forbidden", 404: "not_found"}


class BrokerError(Exception):
    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


def problem(status: int, code: str, detail: str, errors: list[Any] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"type": "about:blank", "title": code, "status": status, "code": code}
    body["detail"] = detail
    if errors:
        body["errors"] = errors
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


async def _broker(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, BrokerError)
    return problem(exc.status, exc.code, exc.detail)


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


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("broker.unexpected_error", path=request.url.path, exc_info=exc)
    return problem(500, "internal", "the request failed unexpectedly")


HANDLERS = {
    BrokerError: _broker,
    CommandError: _command,
    StarletteHTTPException: _http,
    RequestValidationError: _validation,
    Exception: _unexpected,
}
