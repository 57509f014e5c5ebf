"""Model-call failure classes, actions, Retry-After and backoff (DESIGN.md §9, Appendix A).

The errors are the real `openai` exception classes, built the way the SDK builds them from an
HTTP response (the body is the inner `error` object; some tests pass the whole dict).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import httpx2
import openai
import pytest
from openai.types.chat import ChatCompletion

from suzumio.runner.loop.failures import (
    ACTIONS,
    Action,
    FailureClass,
    backoff_seconds,
    classify,
    sleep_in_slices,
)

C = FailureClass
REQUEST = httpx2.Request("POST", "http://model.test/v1/chat/completions")
COMPLETION = ChatCompletion(id="c", choices=[], created=0, model="m", object="chat.completion")
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
ERRORS: dict[int, type[openai.APIStatusError]] = {
    400: openai.BadRequestError,
    401: openai.AuthenticationError,
    403: openai.PermissionDeniedError,
    404: openai.NotFoundError,
    409: openai.ConflictError,
    422: openai.UnprocessableEntityError,
    429: openai.RateLimitError,
}


def status_error(
    status: int,
    text: str = "",
    *,
    code: str | None = None,
    body: object = None,
    headers: dict[str, str] | None = None,
) -> openai.APIStatusError:
    """As `openai._client._make_status_error` does: message 'Error code: N - text'."""
    if body is None and (text or code):
        body = {"message": text, "type": "invalid_request_error", "param": None, "code": code}
    response = httpx2.Response(status, headers=headers or {}, request=REQUEST)
    kind = ERRORS.get(
        status, openai.InternalServerError if status >= 500 else openai.APIStatusError
    )
    message = f"Error code: {status}" + (f" - {text}" if text else "")
    return kind(message, response=response, body=body)


def api_error(message: str, body: object = None) -> openai.APIError:
    """An error event in the middle of a stream: no HTTP status."""
    return openai.APIError(message, REQUEST, body=body)


CASES: dict[str, tuple[BaseException, FailureClass]] = {
    "401 auth": (status_error(401, "Incorrect API key provided"), C.AUTH),
    "403 forbidden": (status_error(403, "Project does not have access"), C.FORBIDDEN),
    "402 billing": (status_error(402, "Insufficient credits on this account"), C.BILLING),
    "402 temporary usage limit is a rate limit": (
        status_error(402, "Usage limit reached temporarily, try again in 5 hours"),
        C.RATE_LIMIT,
    ),
    "429 rate limit": (status_error(429, "Rate limit reached for requests"), C.RATE_LIMIT),
    "429 token-per-minute text is still a rate limit (status first)": (
        status_error(429, "too many tokens per min (TPM)"),
        C.RATE_LIMIT,
    ),
    "429 insufficient_quota is billing": (
        status_error(429, "You exceeded your current quota", code="insufficient_quota"),
        C.BILLING,
    ),
    "500 server error": (status_error(500, "The server had an error"), C.SERVER_ERROR),
    "502 bad gateway": (status_error(502), C.SERVER_ERROR),
    "504 gateway timeout": (status_error(504), C.SERVER_ERROR),
    "500 with context text is still a server error (status first)": (
        status_error(500, "maximum context length"),
        C.SERVER_ERROR,
    ),
    "503 overloaded": (status_error(503, "Service unavailable"), C.OVERLOADED),
    "529 overloaded": (
        status_error(529, body={"type": "overloaded_error", "message": "Overloaded"}),
        C.OVERLOADED,
    ),
    "408 request timeout": (status_error(408), C.TRANSPORT),
    "404 model in the text": (
        status_error(404, "The model `gpt-9` does not exist or you do not have access to it."),
        C.MODEL_NOT_FOUND,
    ),
    "404 model_not_found code": (
        status_error(404, "Not found", code="model_not_found"),
        C.MODEL_NOT_FOUND,
    ),
    "404 without model is unknown": (status_error(404, "Not Found"), C.UNKNOWN),
    "413 payload too large": (status_error(413, "Request Entity Too Large"), C.PAYLOAD_TOO_LARGE),
    "400 context_length_exceeded code": (
        status_error(400, "Input is too long", code="context_length_exceeded"),
        C.CONTEXT_OVERFLOW,
    ),
    "400 maximum context length text": (
        status_error(400, "This model's maximum context length is 8192 tokens."),
        C.CONTEXT_OVERFLOW,
    ),
    "400 context window text": (
        status_error(400, "input exceeds the context window of this model"),
        C.CONTEXT_OVERFLOW,
    ),
    "400 too many tokens text": (
        status_error(400, "Too many tokens in request"),
        C.CONTEXT_OVERFLOW,
    ),
    "400 prompt is too long text": (
        status_error(400, "prompt is too long: 250000 tokens > 200000 maximum"),
        C.CONTEXT_OVERFLOW,
    ),
    "400 context overflow, whole-dict body": (
        status_error(
            400,
            body={"error": {"message": "Input is too long", "code": "context_length_exceeded"}},
        ),
        C.CONTEXT_OVERFLOW,
    ),
    "400 context overflow, plain-text body": (
        status_error(400, body="prompt is too long"),
        C.CONTEXT_OVERFLOW,
    ),
    "400 content_policy_violation code": (
        status_error(400, "Request rejected", code="content_policy_violation"),
        C.CONTENT_POLICY,
    ),
    "400 content_filter code": (
        status_error(400, "Filtered", code="content_filter"),
        C.CONTENT_POLICY,
    ),
    "400 content policy text": (
        status_error(400, "Your request was rejected by our content policy."),
        C.CONTENT_POLICY,
    ),
    "400 safety system text": (
        status_error(400, "Your prompt was flagged by our safety system."),
        C.CONTENT_POLICY,
    ),
    "400 anything else is unknown": (
        status_error(400, "Invalid value for 'temperature'"),
        C.UNKNOWN,
    ),
    "409 conflict is unknown": (status_error(409, "Conflict"), C.UNKNOWN),
    "stream error, overloaded type in a nested body": (
        api_error("Overloaded", {"type": "error", "error": {"type": "overloaded_error"}}),
        C.OVERLOADED,
    ),
    "stream error, status field in a list body": (
        api_error("quota", [{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED"}}]),
        C.RATE_LIMIT,
    ),
    "stream error, context code": (
        api_error("bad request", {"code": "context_length_exceeded"}),
        C.CONTEXT_OVERFLOW,
    ),
    "stream error, rate limit text": (api_error("Rate limit exceeded, slow down"), C.RATE_LIMIT),
    "stream error, model text": (api_error("model 'x' not found"), C.MODEL_NOT_FOUND),
    "connection error": (openai.APIConnectionError(request=REQUEST), C.TRANSPORT),
    "timeout": (openai.APITimeoutError(REQUEST), C.TRANSPORT),
    "httpx2 read error mid-stream": (httpx2.ReadError("reset", request=REQUEST), C.TRANSPORT),
    "httpx remote protocol error": (httpx.RemoteProtocolError("peer closed"), C.TRANSPORT),
    "httpx read timeout": (httpx.ReadTimeout("slow"), C.TRANSPORT),
    "builtin timeout": (TimeoutError(), C.TRANSPORT),
    "builtin connection reset": (ConnectionResetError("reset by peer"), C.TRANSPORT),
    "output cut off by the length limit": (
        openai.LengthFinishReasonError(completion=COMPLETION),
        C.OUTPUT_TRUNCATED,
    ),
    "content filter finish reason": (openai.ContentFilterFinishReasonError(), C.CONTENT_POLICY),
    "anything else": (ValueError("boom"), C.UNKNOWN),
}


@pytest.mark.parametrize(("exc", "expected"), CASES.values(), ids=CASES.keys())
def test_classify(exc, expected):
    failure = classify(exc, now=NOW.timestamp())
    assert failure.cls is expected
    assert failure.action is ACTIONS[expected]
    assert failure.status == getattr(exc, "status_code", None)
    assert failure.message


EXPECTED_ACTIONS = {
    C.RATE_LIMIT: Action.BACKOFF,
    C.OVERLOADED: Action.BACKOFF,
    C.SERVER_ERROR: Action.RETRY,
    C.TRANSPORT: Action.RETRY,
    C.AUTH: Action.FALLBACK,
    C.FORBIDDEN: Action.FALLBACK,
    C.BILLING: Action.STOP,
    C.MODEL_NOT_FOUND: Action.FALLBACK,
    C.CONTEXT_OVERFLOW: Action.COMPACT,
    C.PAYLOAD_TOO_LARGE: Action.COMPACT,
    C.CONTENT_POLICY: Action.STOP,
    C.OUTPUT_TRUNCATED: Action.RETRY,
    C.UNKNOWN: Action.RETRY,
}


def test_every_class_has_its_action():
    assert dict(ACTIONS) == EXPECTED_ACTIONS
    assert set(ACTIONS) == set(FailureClass)


def test_a_long_message_is_cut():
    assert len(classify(status_error(500, "x" * 5000)).message) == 500


RETRY_AFTER: dict[str, tuple[dict[str, str], float | None]] = {
    "no header": ({}, None),
    "seconds": ({"retry-after": "17"}, 17.0),
    "fractional seconds": ({"retry-after": "1.5"}, 1.5),
    "milliseconds win over seconds": ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
    "HTTP date": ({"retry-after": format_datetime(NOW + timedelta(seconds=30), usegmt=True)}, 30.0),
    "HTTP date in the past": (
        {"retry-after": format_datetime(NOW - timedelta(minutes=5), usegmt=True)},
        0.0,
    ),
    "not a number or a date": ({"retry-after": "soon"}, None),
    "negative": ({"retry-after": "-3"}, None),
    "large values are kept; backoff caps them": ({"retry-after": "3600"}, 3600.0),
}


@pytest.mark.parametrize(("headers", "expected"), RETRY_AFTER.values(), ids=RETRY_AFTER.keys())
def test_retry_after(headers, expected):
    failure = classify(status_error(429, "slow down", headers=headers), now=NOW.timestamp())
    assert failure.cls is C.RATE_LIMIT
    assert failure.retry_after == expected


def test_retry_after_is_read_on_overload_too():
    failure = classify(status_error(503, headers={"Retry-After": "5"}))
    assert (failure.cls, failure.action, failure.retry_after) == (C.OVERLOADED, Action.BACKOFF, 5)


class FixedJitter(random.Random):
    def __init__(self, fraction: float) -> None:
        super().__init__(0)
        self.fraction = fraction

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * self.fraction


BACKOFF: dict[str, tuple[int, float | None, float, float]] = {
    # attempt, retry_after, jitter as a fraction of its 0-50 % range, expected seconds
    "first retry": (1, None, 0.0, 2.0),
    "second retry": (2, None, 0.0, 4.0),
    "third retry": (3, None, 0.0, 8.0),
    "sixth retry reaches the 60 s cap": (6, None, 0.0, 60.0),
    "far attempts stay at the cap": (50, None, 0.0, 60.0),
    "full jitter adds half": (1, None, 1.0, 3.0),
    "jitter on top of the 60 s cap": (9, None, 1.0, 90.0),
    "Retry-After longer than the computed wait is the floor": (1, 30.0, 0.0, 30.0),
    "Retry-After is jittered upwards, never downwards": (1, 30.0, 1.0, 45.0),
    "a short Retry-After does not cut the escalation": (4, 1.0, 0.0, 16.0),
    "Retry-After is capped at 600 s": (1, 3600.0, 0.0, 600.0),
    "jitter never crosses the cap": (1, 500.0, 1.0, 600.0),
}


@pytest.mark.parametrize(
    ("attempt", "retry_after", "jitter", "expected"), BACKOFF.values(), ids=BACKOFF.keys()
)
def test_backoff_seconds(attempt, retry_after, jitter, expected):
    assert backoff_seconds(attempt, retry_after, FixedJitter(jitter)) == pytest.approx(expected)


def test_backoff_stays_within_bounds_with_real_randomness():
    rng = random.Random(7)
    for attempt in range(1, 30):
        base = min(2 * 2 ** (attempt - 1), 60)
        assert base <= backoff_seconds(attempt, None, rng) <= base * 1.5
    assert 2 <= backoff_seconds(1, None) <= 3


def test_backoff_counts_attempts_from_one():
    with pytest.raises(ValueError, match="from 1"):
        backoff_seconds(0, None)


class Flag:
    """`cancelled()` that turns True on its n-th call."""

    def __init__(self, true_on_call: int | None) -> None:
        self.calls = 0
        self.true_on_call = true_on_call

    def __call__(self) -> bool:
        self.calls += 1
        return self.true_on_call is not None and self.calls >= self.true_on_call


async def test_sleep_in_slices_runs_to_the_end():
    flag = Flag(None)
    assert await sleep_in_slices(0.03, flag, slice_seconds=0.01) is True
    assert flag.calls >= 3  # checked between slices, not once


async def test_sleep_in_slices_notices_a_cancel_within_one_slice():
    flag = Flag(3)
    # Ten minutes asked for; it returns after two slices of 10 ms (the test timeout guards it).
    assert await sleep_in_slices(600, flag, slice_seconds=0.01) is False
    assert flag.calls == 3


@pytest.mark.parametrize(
    ("seconds", "cancelled", "expected"),
    [(0, None, True), (-1, None, True), (0.01, None, True), (5, Flag(1), False)],
    ids=["zero", "negative", "no cancel callback", "already cancelled"],
)
async def test_sleep_in_slices_edges(seconds, cancelled: Any, expected):
    assert await sleep_in_slices(seconds, cancelled, slice_seconds=0.01) is expected


async def test_sleep_in_slices_rejects_a_zero_slice():
    with pytest.raises(ValueError, match="positive"):
        await sleep_in_slices(1, None, slice_seconds=0)
