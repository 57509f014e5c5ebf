"""What a scripted model answers to one request: text, tool calls or an HTTP error.

Error constructors produce the status, body and headers the OpenAI API sends for that failure,
so the `openai` SDK raises the same exception class it raises against the real service.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Usage:
    """Token counts reported for a completion (`usage` in the response)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    """Reported as `prompt_tokens_details.cached_tokens` (provider prompt-cache hits)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


@dataclass(frozen=True)
class ToolCall:
    """One function call the model asks for.

    Args:
        name: the function name on the wire (`file_read`; no dots in OpenAI names).
        arguments: a JSON object, or a raw string sent as is (to script malformed arguments).
        id: the call id; `call_<request>_<index>` when not given.
    """

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    id: str | None = None

    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(dict(self.arguments))


def error_body(
    message: str, *, type_: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """An OpenAI error body: `{"error": {"message", "type", "param", "code"}}`."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _retry_after(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else str(seconds)


@dataclass(frozen=True)
class Reply:
    """The answer to one chat-completion request. Build it with the class methods.

    `delay` is slept before answering; `chunk_delay` between the chunks of a streamed answer.
    `disconnect_after` (streaming only) drops the connection after that many chunks, with no
    finish chunk and no `[DONE]`, like a network failure mid-answer. `end_after` (streaming
    only) ends the response cleanly after that many chunks, with no finish chunk and no
    `[DONE]` either: an upstream that failed mid-answer behind a proxy that closed the response
    properly.
    """

    content: str | None = None
    calls: tuple[ToolCall, ...] = ()
    finish_reason: str = "stop"
    usage: Usage | None = None
    status: int = 200
    body: Any = None
    """The error body (a JSON value, or a string sent as text/plain) when `status` >= 400."""
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0
    chunk_delay: float = 0.0
    disconnect_after: int | None = None
    end_after: int | None = None

    @property
    def is_error(self) -> bool:
        return self.status >= 400

    @classmethod
    def text(
        cls,
        content: str,
        *,
        finish_reason: str = "stop",
        usage: Usage | None = None,
        delay: float = 0.0,
        chunk_delay: float = 0.0,
        headers: Mapping[str, str] | None = None,
        disconnect_after: int | None = None,
        end_after: int | None = None,
    ) -> Reply:
        """A text answer; `finish_reason` may be `"length"` or `"content_filter"` too."""
        return cls(
            content=content,
            finish_reason=finish_reason,
            usage=usage,
            delay=delay,
            chunk_delay=chunk_delay,
            headers=dict(headers or {}),
            disconnect_after=disconnect_after,
            end_after=end_after,
        )

    @classmethod
    def tool_calls(
        cls,
        calls: Sequence[ToolCall],
        *,
        content: str | None = None,
        usage: Usage | None = None,
        delay: float = 0.0,
        chunk_delay: float = 0.0,
        headers: Mapping[str, str] | None = None,
        disconnect_after: int | None = None,
        end_after: int | None = None,
    ) -> Reply:
        """One or more parallel tool calls (`finish_reason: "tool_calls"`), optional text."""
        if not calls:
            raise ValueError("a tool-call reply needs at least one call")
        return cls(
            content=content,
            calls=tuple(calls),
            finish_reason="tool_calls",
            usage=usage,
            delay=delay,
            chunk_delay=chunk_delay,
            headers=dict(headers or {}),
            disconnect_after=disconnect_after,
            end_after=end_after,
        )

    @classmethod
    def error(
        cls,
        status: int,
        body: Any = None,
        *,
        headers: Mapping[str, str] | None = None,
        delay: float = 0.0,
    ) -> Reply:
        """An HTTP error with this body (a generic OpenAI error body when None)."""
        if status < 400:
            raise ValueError(f"an error reply needs a 4xx/5xx status, not {status}")
        if body is None:
            body = error_body(f"scripted error {status}", type_="scripted_error")
        return cls(status=status, body=body, headers=dict(headers or {}), delay=delay)

    @classmethod
    def context_length_exceeded(cls, *, max_tokens: int = 8192, requested: int = 9000) -> Reply:
        """400 `context_length_exceeded`: the request does not fit the context window."""
        message = (
            f"This model's maximum context length is {max_tokens} tokens. However, your "
            f"messages resulted in {requested} tokens. Please reduce the length of the messages."
        )
        body = error_body(
            message, type_="invalid_request_error", code="context_length_exceeded", param="messages"
        )
        return cls.error(400, body)

    @classmethod
    def content_policy(cls) -> Reply:
        """400 `content_policy_violation`: the provider's safety system refused the request."""
        message = (
            "Your request was rejected as a result of our safety system. Your prompt may "
            "contain text that is not allowed by our safety system."
        )
        body = error_body(message, type_="invalid_request_error", code="content_policy_violation")
        return cls.error(400, body)

    @classmethod
    def unauthorized(cls) -> Reply:
        """401 `invalid_api_key`."""
        message = "Incorrect API key provided. You can find your API key in your account."
        return cls.error(
            401, error_body(message, type_="invalid_request_error", code="invalid_api_key")
        )

    @classmethod
    def forbidden(cls) -> Reply:
        """403: the key may not use this model or project."""
        message = "You are not allowed to sample from this model."
        return cls.error(403, error_body(message, type_="permission_error", code="forbidden"))

    @classmethod
    def model_not_found(cls, model: str) -> Reply:
        """404 `model_not_found`, naming the model."""
        message = f"The model `{model}` does not exist or you do not have access to it."
        return cls.error(
            404, error_body(message, type_="invalid_request_error", code="model_not_found")
        )

    @classmethod
    def payload_too_large(cls) -> Reply:
        """413: the request body is larger than the provider accepts."""
        message = "Request too large. The request body exceeds the maximum size allowed."
        return cls.error(
            413, error_body(message, type_="invalid_request_error", code="request_too_large")
        )

    @classmethod
    def rate_limited(
        cls, retry_after: float = 1, *, code: str = "rate_limit_exceeded", message: str = ""
    ) -> Reply:
        """429 with `Retry-After` (seconds); `code="insufficient_quota"` for a spent quota."""
        text = message or "Rate limit reached for requests. Please try again later."
        return cls.error(
            429,
            error_body(text, type_="requests", code=code),
            headers={"Retry-After": _retry_after(retry_after)},
        )

    @classmethod
    def server_error(cls) -> Reply:
        """500 `server_error`."""
        message = "The server had an error while processing your request. Sorry about that!"
        return cls.error(500, error_body(message, type_="server_error"))

    @classmethod
    def overloaded(cls, retry_after: float | None = None) -> Reply:
        """503: the engine is overloaded; `Retry-After` when given."""
        message = "The engine is currently overloaded, please try again later."
        headers = {} if retry_after is None else {"Retry-After": _retry_after(retry_after)}
        return cls.error(503, error_body(message, type_="server_error"), headers=headers)
