"""What went wrong with a model call, and what the loop should do about it.

DESIGN.md §9 and Appendix A. `classify` checks, in this order: the HTTP status, the error code
in the body, the message text, then transport errors; the first rule that matches wins. Two
statuses are refined by the body because the status alone would send the loop the wrong way:
402 whose text says it is a temporary usage limit is a rate limit, and 429 whose code says the
quota or billing is exhausted (OpenAI's `insufficient_quota`) is billing, since waiting does
not help. 400 and 404 (without "model") decide nothing by themselves and fall through.

The action is a fixed function of the class (`ACTIONS`). Notes for the loop:

- AUTH → FALLBACK: refresh the credential first if it can — the loop asks the tool-broker once
  for the provider's current key and calls the same model again with it if it is a new one
  (`AgentLoop._refreshed`) — then fall back.
- CONTENT_POLICY → STOP: never retry the same request; the loop may try the next model in the
  fallback chain before it reports.
- OUTPUT_TRUNCATED → RETRY with the output-token cap doubled (up to 32,768).
- UNKNOWN → RETRY, bounded by the loop like every retry.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import Any

import openai

MAX_BACKOFF_SECONDS = 600.0
BASE_BACKOFF_SECONDS = 2.0
MAX_COMPUTED_BACKOFF_SECONDS = 60.0
JITTER_RATIO = 0.5
MESSAGE_MAX_CHARS = 500


class FailureClass(StrEnum):
    RATE_LIMIT = "rate_limit"
    OVERLOADED = "overloaded"
    SERVER_ERROR = "server_error"
    TRANSPORT = "transport"
    AUTH = "auth"
    FORBIDDEN = "forbidden"
    BILLING = "billing"
    MODEL_NOT_FOUND = "model_not_found"
    CONTEXT_OVERFLOW = "context_overflow"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    CONTENT_POLICY = "content_policy"
    OUTPUT_TRUNCATED = "output_truncated"
    UNKNOWN = "unknown"


class Action(StrEnum):
    RETRY = "retry"
    BACKOFF = "backoff"
    FALLBACK = "fallback"
    COMPACT = "compact"
    STOP = "stop"


F = FailureClass
ACTIONS: Mapping[FailureClass, Action] = {
    F.RATE_LIMIT: Action.BACKOFF,
    F.OVERLOADED: Action.BACKOFF,
    F.SERVER_ERROR: Action.RETRY,
    F.TRANSPORT: Action.RETRY,
    F.AUTH: Action.FALLBACK,
    F.FORBIDDEN: Action.FALLBACK,
    F.BILLING: Action.STOP,
    F.MODEL_NOT_FOUND: Action.FALLBACK,
    F.CONTEXT_OVERFLOW: Action.COMPACT,
    F.PAYLOAD_TOO_LARGE: Action.COMPACT,
    F.CONTENT_POLICY: Action.STOP,
    F.OUTPUT_TRUNCATED: Action.RETRY,
    F.UNKNOWN: Action.RETRY,
}


@dataclass(frozen=True)
class Failure:
    cls: FailureClass
    action: Action
    status: int | None
    message: str
    retry_after: float | None = None
    """Seconds the provider asked us to wait (Retry-After), uncapped; `backoff_seconds` caps."""


# Codes and phrases, lower case. Codes are matched exactly against the body's
# `code` / `type` / `status` fields; phrases as substrings of the message text.
CODES: tuple[tuple[FailureClass, frozenset[str]], ...] = (
    (F.CONTEXT_OVERFLOW, frozenset({"context_length_exceeded", "context_window_exceeded"})),
    (F.CONTENT_POLICY, frozenset({"content_policy_violation", "content_filter"})),
    (F.MODEL_NOT_FOUND, frozenset({"model_not_found"})),
    (F.BILLING, frozenset({"insufficient_quota", "billing_hard_limit_reached"})),
    (F.RATE_LIMIT, frozenset({"rate_limit_exceeded", "rate_limit_error", "resource_exhausted"})),
    (F.OVERLOADED, frozenset({"overloaded_error", "server_overloaded"})),
    (F.PAYLOAD_TOO_LARGE, frozenset({"request_too_large"})),
    (F.AUTH, frozenset({"invalid_api_key", "authentication_error"})),
    (F.FORBIDDEN, frozenset({"permission_error", "permission_denied"})),
)
PHRASES: tuple[tuple[FailureClass, tuple[str, ...]], ...] = (
    (
        F.CONTEXT_OVERFLOW,
        (
            "context_length_exceeded",
            "maximum context length",
            "context window",
            "context length",
            "too many tokens",
            "prompt is too long",
        ),
    ),
    (
        F.CONTENT_POLICY,
        ("content_policy_violation", "content_filter", "content policy", "safety system"),
    ),
    (F.RATE_LIMIT, ("rate limit", "too many requests")),
    (F.OVERLOADED, ("overloaded",)),
)
_TEMPORARY_LIMIT = re.compile(
    r"temporar|try again|retry after|rate.?limit|usage limit.*(?:reset|until|hour|minute|day)"
)
_TRANSPORT_NAMES = frozenset({"TransportError", "TimeoutException", "NetworkError"})


@dataclass(frozen=True)
class _Info:
    status: int | None
    codes: frozenset[str]
    text: str
    retry_after: float | None


def classify(exc: BaseException, *, now: float | None = None) -> Failure:
    """Classify a model-call error. `now` (epoch seconds) resolves HTTP-date Retry-After."""
    if isinstance(exc, openai.LengthFinishReasonError):
        return _failure(F.OUTPUT_TRUNCATED, None, str(exc), None)
    if isinstance(exc, openai.ContentFilterFinishReasonError):
        return _failure(F.CONTENT_POLICY, None, str(exc), None)
    info = _inspect(exc, time.time() if now is None else now)
    cls = _by_status(info) or _by_code(info) or _by_text(info) or _by_transport(exc)
    return _failure(cls or F.UNKNOWN, info.status, _message(exc), info.retry_after)


def _failure(
    cls: FailureClass, status: int | None, message: str, retry_after: float | None
) -> Failure:
    return Failure(cls, ACTIONS[cls], status, message[:MESSAGE_MAX_CHARS], retry_after)


def _by_status(info: _Info) -> FailureClass | None:  # noqa: PLR0911 - one line per rule
    match info.status:
        case 401:
            return F.AUTH
        case 403:
            return F.FORBIDDEN
        case 402:
            return F.RATE_LIMIT if _TEMPORARY_LIMIT.search(info.text) else F.BILLING
        case 429:
            return F.BILLING if info.codes & _codes_of(F.BILLING) else F.RATE_LIMIT
        case 404 if "model" in info.text or "model_not_found" in info.codes:
            return F.MODEL_NOT_FOUND
        case 413:
            return F.PAYLOAD_TOO_LARGE
        case 408:
            return F.TRANSPORT
        case 503 | 529:
            return F.OVERLOADED
        case int(status) if status >= 500:
            return F.SERVER_ERROR
        case _:
            return None


def _codes_of(cls: FailureClass) -> frozenset[str]:
    return next(codes for c, codes in CODES if c is cls)


def _by_code(info: _Info) -> FailureClass | None:
    return next((cls for cls, codes in CODES if info.codes & codes), None)


def _by_text(info: _Info) -> FailureClass | None:
    for cls, phrases in PHRASES:
        if any(p in info.text for p in phrases):
            return cls
    if "model" in info.text and ("not found" in info.text or "does not exist" in info.text):
        return F.MODEL_NOT_FOUND
    return None


def _by_transport(exc: BaseException) -> FailureClass | None:
    if isinstance(exc, openai.APIConnectionError | TimeoutError | ConnectionError):
        return F.TRANSPORT
    # Errors raised while a stream is read come straight from the HTTP client (httpx or the
    # SDK's httpx2); recognise their base classes by name so neither has to be imported.
    if any(k.__module__.startswith("httpx") and k.__name__ in _TRANSPORT_NAMES for k in _mro(exc)):
        return F.TRANSPORT
    return None


def _mro(exc: BaseException) -> tuple[type, ...]:
    return type(exc).__mro__


def _inspect(exc: BaseException, now: float) -> _Info:
    status = getattr(exc, "status_code", None)
    body = getattr(exc, "body", None)
    codes = {str(c).lower() for c in _codes(body)}
    code_attr = getattr(exc, "code", None)
    if isinstance(code_attr, str):
        codes.add(code_attr.lower())
    text = " ".join([_message(exc), *_body_messages(body)]).lower()
    return _Info(
        status if isinstance(status, int) else None,
        frozenset(codes),
        text,
        _retry_after(exc, now),
    )


def _error_objects(body: object) -> Iterator[Mapping[str, Any]]:
    """The body itself and any nested `error` objects; a list body counts by its first item."""
    if isinstance(body, list) and body:
        body = body[0]
    while isinstance(body, Mapping):
        yield body
        body = body.get("error")


def _codes(body: object) -> Iterator[object]:
    for obj in _error_objects(body):
        for key in ("code", "type", "status"):
            if isinstance(obj.get(key), str):
                yield obj[key]


def _body_messages(body: object) -> Iterator[str]:
    if isinstance(body, str):
        yield body
    for obj in _error_objects(body):
        for key in ("message", "error"):
            if isinstance(obj.get(key), str):
                yield obj[key]


def _message(exc: BaseException) -> str:
    message = getattr(exc, "message", None)
    return message if isinstance(message, str) else str(exc) or type(exc).__name__


def _retry_after(exc: BaseException, now: float) -> float | None:
    headers = getattr(getattr(exc, "response", None), "headers", None)
    if headers is None:
        return None
    if (ms := _number(headers.get("retry-after-ms"))) is not None:
        return ms / 1000
    value = headers.get("retry-after")
    if not isinstance(value, str):
        return None
    if (seconds := _number(value)) is not None:
        return seconds
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(when.timestamp() - now, 0.0)


def _number(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number >= 0 else None


def backoff_seconds(
    attempt: int, retry_after: float | None, rng: random.Random | None = None
) -> float:
    """Seconds to wait before retry number `attempt` (1 = the first retry).

    `min(2 * 2**(attempt-1), 60)` plus 0-50 % jitter. A Retry-After is a floor, not a
    replacement: the wait is `max(retry_after, computed)` with the jitter applied to that, so
    we never come back earlier than the provider asked, many runners sharing one key do not
    all return at the same instant, and a Retry-After shorter than our own escalation does
    not cut it short. Everything is capped at 600 s.
    """
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, not {attempt}")
    exponent = min(attempt - 1, 16)  # 2 * 2**16 is far past the cap; keeps the float small
    base = min(BASE_BACKOFF_SECONDS * 2.0**exponent, MAX_COMPUTED_BACKOFF_SECONDS)
    floor = max(base, retry_after or 0.0)
    jitter = (rng.uniform if rng else random.uniform)(0.0, JITTER_RATIO)
    return min(floor * (1.0 + jitter), MAX_BACKOFF_SECONDS)


async def sleep_in_slices(
    seconds: float, cancelled: Callable[[], bool] | None, slice_seconds: float = 0.25
) -> bool:
    """Sleep `seconds` in slices, checking `cancelled` before and after each one.

    Returns True when the whole time passed, False as soon as `cancelled()` says so.
    """
    if slice_seconds <= 0:
        raise ValueError("slice_seconds must be positive")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(seconds, 0.0)
    while True:
        if cancelled is not None and cancelled():
            return False
        remaining = deadline - loop.time()
        if remaining <= 0:
            return True
        await asyncio.sleep(min(slice_seconds, remaining))
