"""A `Reply` as OpenAI chat-completion JSON: one `chat.completion` object, or the
`chat.completion.chunk` sequence of a streamed answer, split the way OpenAI splits it."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from suzumio.testing.model.replies import Reply, ToolCall, Usage

FINGERPRINT = "fp_suzumio_scripted"
ARGUMENT_FRAGMENT_CHARS = 8


@dataclass(frozen=True)
class Answer:
    """A successful reply bound to the request it answers (ids, model name, usage)."""

    reply: Reply
    completion_id: str
    model: str
    created: int
    call_ids: tuple[str, ...]
    usage: Usage

    @classmethod
    def build(cls, reply: Reply, body: dict[str, Any], number: int, created: int) -> Answer:
        call_ids = tuple(c.id or f"call_{number}_{i}" for i, c in enumerate(reply.calls))
        return cls(
            reply=reply,
            completion_id=f"chatcmpl-scripted-{number}",
            model=str(body.get("model") or "scripted"),
            created=created,
            call_ids=call_ids,
            usage=reply.usage or estimate_usage(body, reply),
        )


def estimate_usage(body: dict[str, Any], reply: Reply) -> Usage:
    """About four characters a token; deterministic, for replies that script no usage."""
    prompt = len(json.dumps(body.get("messages") or [], sort_keys=True))
    completion = len(reply.content or "") + sum(len(c.arguments_json()) for c in reply.calls)
    return Usage(prompt_tokens=max(1, prompt // 4), completion_tokens=max(1, completion // 4))


def split_text(text: str) -> list[str]:
    """Word-sized pieces, each with its leading whitespace, that join back to `text`."""
    pieces = re.findall(r"\s*\S+", text)
    tail = text[len("".join(pieces)) :]
    if tail:
        pieces.append(tail)
    return pieces or [text]


def split_arguments(arguments: str) -> list[str]:
    size = ARGUMENT_FRAGMENT_CHARS
    return [arguments[i : i + size] for i in range(0, len(arguments), size)]


def _function(call: ToolCall, call_id: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments_json()},
    }


def completion_json(answer: Answer) -> dict[str, Any]:
    reply = answer.reply
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
    if reply.calls:
        message["tool_calls"] = [
            _function(call, call_id)
            for call, call_id in zip(reply.calls, answer.call_ids, strict=True)
        ]
    return {
        "id": answer.completion_id,
        "object": "chat.completion",
        "created": answer.created,
        "model": answer.model,
        "system_fingerprint": FINGERPRINT,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": reply.finish_reason,
            }
        ],
        "usage": answer.usage.to_json(),
    }


def _tool_call_deltas(call: ToolCall, call_id: str, index: int) -> list[dict[str, Any]]:
    opening = {
        "index": index,
        "id": call_id,
        "type": "function",
        "function": {"name": call.name, "arguments": ""},
    }
    fragments = [
        {"index": index, "function": {"arguments": piece}}
        for piece in split_arguments(call.arguments_json())
    ]
    return [{"tool_calls": [delta]} for delta in (opening, *fragments)]


def stream_json(answer: Answer, *, include_usage: bool) -> list[dict[str, Any]]:
    """Every chunk of a streamed answer, in order (the caller adds `data: [DONE]`)."""
    reply = answer.reply
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": "", "refusal": None}]
    if reply.content:
        deltas.extend({"content": piece} for piece in split_text(reply.content))
    for index, (call, call_id) in enumerate(zip(reply.calls, answer.call_ids, strict=True)):
        deltas.extend(_tool_call_deltas(call, call_id, index))
    chunks = [_chunk(answer, delta, None, include_usage=include_usage) for delta in deltas]
    chunks.append(_chunk(answer, {}, reply.finish_reason, include_usage=include_usage))
    if include_usage:
        usage_chunk = _chunk(answer, {}, None, include_usage=True)
        usage_chunk["choices"] = []
        usage_chunk["usage"] = answer.usage.to_json()
        chunks.append(usage_chunk)
    return chunks


def _chunk(
    answer: Answer, delta: dict[str, Any], finish_reason: str | None, *, include_usage: bool
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": answer.completion_id,
        "object": "chat.completion.chunk",
        "created": answer.created,
        "model": answer.model,
        "system_fingerprint": FINGERPRINT,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }
    if include_usage:
        chunk["usage"] = None
    return chunk


def sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()
