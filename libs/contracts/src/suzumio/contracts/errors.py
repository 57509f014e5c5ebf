"""Typed command errors: what a command's reply says when it is refused.

Each error has a stable `code`; the gateway maps codes to HTTP statuses and problem bodies, the
CLI to messages, and a command client re-raises the matching exception class.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field


class ErrorCode(StrEnum):
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    INVALID = "invalid"
    FORBIDDEN = "forbidden"
    UNAVAILABLE = "unavailable"
    TIMEOUT = "timeout"
    INTERNAL = "internal"


HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.CONFLICT: 409,
    ErrorCode.INVALID: 422,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.TIMEOUT: 504,
    ErrorCode.INTERNAL: 500,
}
"""How an HTTP API answers each code (the gateway and the tool-broker alike)."""


class ErrorBody(BaseModel):
    """The wire form of a refused command."""

    model_config = ConfigDict(frozen=True)

    code: ErrorCode
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


class CommandError(Exception):
    """Base of the typed errors a command can end with."""

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_body(self) -> ErrorBody:
        return ErrorBody(code=self.code, message=self.message, details=self.details)

    @staticmethod
    def from_body(body: ErrorBody) -> CommandError:
        cls = _BY_CODE.get(body.code, InternalError)
        return cls(body.message, **body.details)


class NotFoundError(CommandError):
    """The object does not exist, or the actor may not see it (the two look the same)."""

    code = ErrorCode.NOT_FOUND


class ConflictError(CommandError):
    """The object changed under the command, or its state refuses the command."""

    code = ErrorCode.CONFLICT


ID_TAKEN = "id_taken"
"""The `reason` of a ConflictError refusing an id already used."""


def id_taken(what: str) -> ConflictError:
    """The refusal of an id already used (`what`: "a session"). Typed by its `reason`: a
    retry whose first attempt's answer was lost is refused so, and looks for it."""
    return ConflictError(f"{what} with this id exists already", reason=ID_TAKEN)


def is_id_taken(exc: CommandError) -> bool:
    """Whether `exc` refused an id as already used. By its words too: a service of the
    release before this one (mid-upgrade) said so only in words."""
    return isinstance(exc, ConflictError) and (
        exc.details.get("reason") == ID_TAKEN or "exists already" in exc.message
    )


class InvalidError(CommandError):
    """The command is malformed or breaks a rule of the domain."""

    code = ErrorCode.INVALID


class ForbiddenError(CommandError):
    """The actor is known to see the object but may not do this to it."""

    code = ErrorCode.FORBIDDEN


class UnavailableError(CommandError):
    """No service answered the command's subject."""

    code = ErrorCode.UNAVAILABLE


class CommandTimeoutError(CommandError):
    """The owning service did not answer in time; the command may or may not have applied."""

    code = ErrorCode.TIMEOUT


class InternalError(CommandError):
    code = ErrorCode.INTERNAL


_BY_CODE: dict[ErrorCode, type[CommandError]] = {
    cls.code: cls
    for cls in (
        NotFoundError,
        ConflictError,
        InvalidError,
        ForbiddenError,
        UnavailableError,
        CommandTimeoutError,
        InternalError,
    )
}
