"""The offline demo model (DESIGN.md §12): what agents talk to when no model key is configured,
so the whole path runs without network.

Deterministic, no network, no randomness. Every answer starts with `LABEL` so nobody mistakes it
for a real model. "read <path>" and "list files [in <dir>]" ask for a `file_read` call (the
runner's `file.read` lists a directory), "search for <text>" for a `file_search` call with the
text as an escaped regular expression, when the request offers that tool; tool results are
summarised; anything else is echoed back.
"""

from __future__ import annotations

import json
import re
from typing import Any

from suzumio.testing.model.replies import Reply, ToolCall

DEMO_MODEL_NAME = "suzumio-demo"
LABEL = "[offline demo model]"
READ_TOOL = "file_read"
SEARCH_TOOL = "file_search"

_TARGET = r"(?P<target>\"[^\"]+\"|'[^']+'|`[^`]+`|\S+)"
_READ = re.compile(r"\bread\s+(?:the\s+)?(?:file\s+)?" + _TARGET, re.IGNORECASE)
_LIST = re.compile(
    r"\blist\s+(?:all\s+|the\s+)?files\b(?:\s+(?:in|under)\s+" + _TARGET + ")?", re.IGNORECASE
)
_SEARCH = re.compile(r"\b(?:search|grep)\s+(?:for\s+)?" + _TARGET, re.IGNORECASE)
_QUOTES = "\"'`"
_EXCERPT_LINES = 8
_EXCERPT_CHARS = 600


class DemoModel:
    """A responder (use it as a step or as the server's default) that plays the demo model."""

    name = DEMO_MODEL_NAME

    def __repr__(self) -> str:
        return "DemoModel()"

    def __call__(self, body: dict[str, Any]) -> Reply:
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        results = _trailing_tool_results(messages)
        if results:
            return Reply.text(_summary(messages, results))
        return _answer(_last_user_text(messages), _offered_tools(body))


def _answer(text: str, offered: set[str]) -> Reply:
    if (path := _target(_READ, text, needs_path_shape=True)) is not None:
        return _call_or_explain(ToolCall(READ_TOOL, {"path": path}), offered, f"read {path}")
    if _LIST.search(text):
        directory = _target(_LIST, text, needs_path_shape=False) or "."
        call = ToolCall(READ_TOOL, {"path": directory})
        return _call_or_explain(call, offered, f"list the files in {directory}")
    if (term := _target(_SEARCH, text, needs_path_shape=False)) is not None:
        call = ToolCall(SEARCH_TOOL, {"pattern": re.escape(term)})
        return _call_or_explain(call, offered, f"search the files for {term}")
    return Reply.text(_echo(text))


def _call_or_explain(call: ToolCall, offered: set[str], wish: str) -> Reply:
    if call.name in offered:
        return Reply.tool_calls([call], content=f"{LABEL} I will {wish} with {call.name}.")
    return Reply.text(
        f"{LABEL} I would {wish} with the {call.name} tool, but this request does not offer it."
    )


def _target(pattern: re.Pattern[str], text: str, *, needs_path_shape: bool) -> str | None:
    match = pattern.search(text)
    if match is None or match.group("target") is None:
        return None
    raw = match.group("target")
    if raw[0] in _QUOTES:
        return raw[1:-1] or None
    path = raw.rstrip(".,;:!?)")
    if needs_path_shape and not re.search(r"[./]", path):
        return None  # "read me a story" asks for no file
    return path or None


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _offered_tools(body: dict[str, Any]) -> set[str]:
    offered: set[str] = set()
    for tool in body.get("tools") or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            offered.add(function["name"])
    return offered


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return _text_of(message.get("content"))
    return ""


def _trailing_tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for message in reversed(messages):
        if message.get("role") != "tool":
            break
        results.insert(0, message)
    return results


def _calls_by_id(messages: list[dict[str, Any]]) -> dict[str, str]:
    calls: dict[str, str] = {}
    for message in messages:
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            calls[call.get("id", "")] = f"{function.get('name')}({function.get('arguments', '')})"
    return calls


def _summary(messages: list[dict[str, Any]], results: list[dict[str, Any]]) -> str:
    calls = _calls_by_id(messages)
    noun = "tool" if len(results) == 1 else "tools"
    parts = [f"{LABEL} Here is what the {noun} returned."]
    for result in results:
        content = _text_of(result.get("content"))
        lines = content.splitlines()
        excerpt = "\n".join(lines[:_EXCERPT_LINES])[:_EXCERPT_CHARS]
        more = "" if excerpt == content else "\n..."
        what = calls.get(str(result.get("tool_call_id")), "a tool call")
        size = f"{len(lines)} lines, {len(content)} characters"
        parts.append(f"{what} returned {size}:\n{excerpt}{more}")
    return "\n\n".join(parts)


def _echo(text: str) -> str:
    said = " ".join(text.split())
    if len(said) > 200:
        said = said[:197] + "..."
    opening = f"You said: {json.dumps(said, ensure_ascii=False)}." if said else "Hello."
    return (
        f"{LABEL} {opening} I am a built-in stand-in that answers without network access; "
        "configure a model provider key to talk to a real model. "
        'Ask me to "read <path>" or "list files" to see a tool call.'
    )
