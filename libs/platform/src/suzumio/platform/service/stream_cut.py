"""Cutting a response whose body has begun, on purpose.

Once a response's head is sent, the only way left to tell an HTTP client that the body is not
whole is to break the connection: an exception out of the ASGI app makes uvicorn close it
with the chunked body unfinished, so the client sees a broken stream (and retries), never one
that ended as if whole. uvicorn logs each such exception as an error of the application, with
its traceback; a cut made on purpose is logged by whoever made it, in a line that says why,
so a `StreamCutError` is kept out of uvicorn's log (`quiet_uvicorn_cuts`, which the service
runtime installs)."""

from __future__ import annotations

import logging


class StreamCutError(Exception):
    """Raised inside a response body already begun to cut its connection on purpose."""


def is_cut(exc: BaseException | None) -> bool:
    """`exc` is a cut (or a group of nothing else: a task group may wrap it)."""
    if isinstance(exc, StreamCutError):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(is_cut(inner) for inner in exc.exceptions)
    return False


class _QuietCuts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and is_cut(record.exc_info[1]))


_QUIET = _QuietCuts()


def quiet_uvicorn_cuts() -> None:
    """uvicorn logs no traceback for a `StreamCutError` (installing it again changes nothing)."""
    logging.getLogger("uvicorn.error").addFilter(_QUIET)
