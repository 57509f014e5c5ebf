"""Context compaction, minus the model call: measure, prune, split, build the summariser's
request, splice its answer in, and decide when compaction may run (DESIGN.md §9, Appendix A).

The loop's use: when `prompt_tokens` (the provider's real count at the last model call, the
`UsageAnchor`, plus an estimate of the messages added since; the estimate alone where no usage
was reported) or the provider says the prompt is over `threshold_tokens`, `prune` first
(free); if still over, `split`, send `summary_request(middle)` to the summariser, archive the
raw range through the broker, and continue with `apply(split, summary)`. `prune` keeps one
message per message, so the raw range is the same positions (`len(head)` to
`len(messages) - len(tail)`) of the list before pruning. `CompactionGovernor` says whether an
attempt may run at all.

Where the conversation is cut: the head is the system prompt(s) plus the first exchange (the
first user message, the assistant reply to it and that reply's tool results); the tail is the
most recent `tail_ratio` x threshold tokens, at least `min_tail_messages` messages, always
reaching back to the last assistant message that is not already in the head. The last user
message (the request being worked on) is kept word for word too, but not by pinning the tail
to it: everything after it would then be beyond compaction, and a long activation on one
request (twenty file reads) would outgrow the window with nothing left to summarise. When it
falls in the middle, the summary marker quotes it after the summary (`marker_text`). A summary
marker never counts as "the last user message", or it would be quoted into itself. Cuts only
fall where no assistant tool call is separated from any of its tool results; when a cut would
split one, the tail grows backwards (and the head forwards) until it does not.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]

SUMMARY_PREFIX = "[Summary of earlier conversation]"
REDACTED = "[redacted]"
CHARS_PER_TOKEN = 4
"""English prose and code average a little under 4 characters per token on current BPE
tokenisers; rounding each message up and the overhead below keep the guess on the high side."""
MESSAGE_OVERHEAD_TOKENS = 4
"""Role and framing tokens per message (OpenAI documents 3-4)."""
NON_TEXT_PART_TOKENS = 1024
"""A content part that is not text (an image): a flat guess instead of its base64 length."""
DIGEST_OVER_CHARS = 200
LARGE_ARGUMENTS_CHARS = 1000
ARGUMENT_STRING_KEEP_CHARS = 200
TRANSCRIPT_MESSAGE_MAX_CHARS = 4000
REQUEST_HEADING = "## The request being worked on when this summary was written, word for word"
SECTIONS = (
    "Goal",
    "Constraints",
    "Completed actions",
    "Active state",
    "Open questions",
    "Relevant files",
    "Remaining work",
)


# ---------------------------------------------------------------------------------------------
# Measuring


def estimate_tokens(messages: Iterable[Message]) -> int:
    """A cheap upper-leaning guess: ceil(characters / 4) + 4 per message, tool calls included."""
    return sum(_tokens(m) for m in messages)


def _tokens(message: Message) -> int:
    content = message.get("content")
    if type(content) is str and "tool_calls" not in message and "tool_call_id" not in message:
        # Most messages, on every model call: their text alone (what the rest comes to).
        return MESSAGE_OVERHEAD_TOKENS + -(-len(content) // CHARS_PER_TOKEN)
    return _any_tokens(message)


def _any_tokens(message: Message) -> int:
    content = message.get("content")
    chars = len(_text(content)) + len(str(message.get("tool_call_id") or ""))
    for call in _tool_calls(message):
        function = call.get("function") or {}
        chars += len(str(call.get("id") or "")) + len(str(function.get("name") or ""))
        chars += len(str(function.get("arguments") or ""))
    parts = content if isinstance(content, list) else []
    images = sum(1 for p in parts if not (isinstance(p, dict) and p.get("type") == "text"))
    return (
        MESSAGE_OVERHEAD_TOKENS + math.ceil(chars / CHARS_PER_TOKEN) + images * NON_TEXT_PART_TOKENS
    )


@dataclass(frozen=True)
class UsageAnchor:
    """What the provider counted: `tokens` for the first `messages` messages of the
    conversation (a model call's prompt_tokens, plus its completion_tokens for the reply that
    follows the prompt when those were reported)."""

    messages: int
    tokens: int


def usage_anchor(sent: int, usage: Mapping[str, int]) -> UsageAnchor | None:
    """The anchor a model call's `usage` gives, `sent` being how many messages it was sent
    (its reply is the next one); None when the provider reported no prompt tokens."""
    prompt = usage.get("prompt_tokens", 0)
    if prompt <= 0:
        return None
    completion = usage.get("completion_tokens", 0)
    if completion <= 0:
        return UsageAnchor(sent, prompt)  # the reply is estimated with what follows it
    return UsageAnchor(sent + 1, prompt + completion)


def prompt_tokens(messages: Sequence[Message], anchor: UsageAnchor | None) -> int:
    """The conversation's size: the provider's real count for the part it measured plus an
    estimate of the messages added since; the estimate of the whole without an anchor.

    `estimate_tokens` guesses 4 characters a token, which Chinese or Japanese text (about a
    token a character, or more) beats several-fold: on its own it would let the prompt grow
    past the window before the threshold is seen. The caller drops the anchor whenever the
    messages it counted change (a compaction); one that counted more messages than there are
    is stale and ignored.
    """
    if anchor is None or anchor.messages > len(messages):
        return estimate_tokens(messages)
    return anchor.tokens + estimate_tokens(messages[anchor.messages :])


def threshold_tokens(context_window: int, max_output_tokens: int, ratio: float = 0.5) -> int:
    """Prompt size at which to compact: ratio x (window - max output), never negative."""
    if not 0 < ratio <= 1:
        raise ValueError(f"ratio must be in (0, 1], not {ratio}")
    return int(ratio * max(context_window - max_output_tokens, 0))


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _tool_calls(message: Message) -> list[dict[str, Any]]:
    calls = message.get("tool_calls") if message.get("role") == "assistant" else None
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def is_summary(message: Message) -> bool:
    content = message.get("content")
    return (
        message.get("role") == "user"
        and isinstance(content, str)
        and content.startswith(SUMMARY_PREFIX)
    )


# ---------------------------------------------------------------------------------------------
# Where to cut


@dataclass(frozen=True)
class Split:
    head: tuple[Message, ...]
    middle: tuple[Message, ...]
    """Empty when there is nothing to compact (a lone earlier summary counts as nothing)."""
    tail: tuple[Message, ...]
    request: Message | None = None
    """What the summary marker quotes: the last user message when it is in the middle, or
    the request an earlier marker in the middle quoted (the last user message is older)."""


def split(
    messages: Sequence[Message],
    threshold: int,
    tail_ratio: float = 0.2,
    min_tail_messages: int = 8,
) -> Split:
    head_end, tail_start = _bounds(messages, threshold, tail_ratio, min_tail_messages)
    return _split_at(messages, head_end, tail_start)


def at_most(messages: Sequence[Message], parts: Split, most: int) -> Split:
    """`parts` (of `messages`) with a middle of at most `most` messages, cut where no tool
    call is parted from its result: the rest of the middle joins the tail, for a later
    compaction. A marker names every entry it archives, and the log takes so many at most."""
    head_end = len(parts.head)
    if len(parts.middle) <= most:
        return parts
    cuts = _valid_cuts(messages)
    end = head_end + most
    while end > head_end and not cuts[end]:
        end -= 1
    return _split_at(messages, head_end, end)


def _split_at(messages: Sequence[Message], head_end: int, tail_start: int) -> Split:
    if all(is_summary(m) for m in messages[head_end:tail_start]):
        head_end = tail_start
    last_user = _last_index(messages, "user")
    request: Message | None = None
    if last_user is not None and head_end <= last_user < tail_start:
        request = messages[last_user]
    elif last_user is None or last_user < head_end:
        # Compacted before, the request lives on only as an earlier marker's quote: carried
        # on, or the summary that replaces that marker would lose its words.
        quoted = _quoted_request(messages[head_end:tail_start])
        request = {"role": "user", "content": quoted} if quoted is not None else None
    return Split(
        tuple(messages[:head_end]),
        tuple(messages[head_end:tail_start]),
        tuple(messages[tail_start:]),
        request,
    )


def _quoted_request(messages: Sequence[Message]) -> str | None:
    """The request the latest summary marker among `messages` quotes, if it quotes one."""
    for message in reversed(messages):
        if is_summary(message):
            _, found, quoted = str(message["content"]).partition(f"\n{REQUEST_HEADING}\n")
            return quoted if found else None
    return None


def _bounds(
    messages: Sequence[Message], threshold: int, tail_ratio: float, min_tail: int
) -> tuple[int, int]:
    cuts = _valid_cuts(messages)
    head_end = _first_exchange_end(messages)
    while not cuts[head_end]:
        head_end += 1
    start = _tail_by_size(messages, head_end, tail_ratio * max(threshold, 0), min_tail)
    last = _last_index(messages, "assistant")
    if last is not None and last >= head_end:
        start = min(start, last)
    while not cuts[start]:
        start -= 1
    return head_end, max(start, head_end)


def _first_exchange_end(messages: Sequence[Message]) -> int:
    n, i = len(messages), 0
    while i < n and messages[i].get("role") == "system":
        i += 1
    if i < n and messages[i].get("role") == "user":
        i += 1
    if i < n and messages[i].get("role") == "assistant":
        i += 1
        while i < n and messages[i].get("role") == "tool":
            i += 1
    return i


def _tail_by_size(messages: Sequence[Message], floor: int, budget: float, min_tail: int) -> int:
    start, used = len(messages), 0
    while start > floor:
        tokens = _tokens(messages[start - 1])
        if len(messages) - start >= min_tail and used + tokens > budget:
            break
        used += tokens
        start -= 1
    return start


def _last_index(messages: Sequence[Message], role: str) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == role and not is_summary(messages[i]):
            return i
    return None


def _valid_cuts(messages: Sequence[Message]) -> list[bool]:
    """cuts[i]: cutting before message i separates no tool call from its result."""
    owner: dict[str, int] = {}
    cuts = [True] * (len(messages) + 1)
    last_assistant: int | None = None
    for j, message in enumerate(messages):
        if message.get("role") == "assistant":
            last_assistant = j
            owner.update({str(c.get("id")): j for c in _tool_calls(message)})
        elif message.get("role") == "tool":
            # A result whose call is unknown stays with the nearest assistant before it.
            o = owner.get(str(message.get("tool_call_id")), last_assistant)
            for i in range(j + 1 if o is None else o + 1, j + 1):
                cuts[i] = False
    return cuts


# ---------------------------------------------------------------------------------------------
# Free pruning


def prune(
    messages: Sequence[Message],
    threshold: int | None = None,
    *,
    tail_ratio: float = 0.2,
    min_tail_messages: int = 8,
) -> list[Message]:
    """Shrink old bulk without a model: duplicate tool outputs become back-references, tool
    outputs over 200 characters become one-line digests, huge tool-call arguments are cut
    inside valid JSON. Only the middle (as `split` would cut it with the same settings) is
    touched; the input is not modified. Without a threshold the tail is the minimal one.
    """
    head_end, tail_start = _bounds(messages, threshold or 0, tail_ratio, min_tail_messages)
    calls = {str(c.get("id")): c.get("function") or {} for m in messages for c in _tool_calls(m)}
    first_seen: dict[str, str] = {}
    return [
        _prune_one(m, head_end <= i < tail_start, calls, first_seen) for i, m in enumerate(messages)
    ]


def _prune_one(
    message: Message, prunable: bool, calls: dict[str, Any], first_seen: dict[str, str]
) -> Message:
    content = message.get("content")
    if message.get("role") == "tool" and isinstance(content, str):
        call_id = str(message.get("tool_call_id"))
        earlier = first_seen.setdefault(content, call_id)
        if prunable:
            earlier_call = None if earlier == call_id else earlier
            new = _pruned_output(content, earlier_call, calls.get(call_id, {}))
            return {**message, "content": new} if new != content else message
    elif prunable and _tool_calls(message):
        return {**message, "tool_calls": [_shorten_call(c) for c in _tool_calls(message)]}
    return message


def _pruned_output(content: str, earlier_call: str | None, function: dict[str, Any]) -> str:
    if earlier_call is not None:
        reference = f"[same output as call {earlier_call} above]"
        if len(reference) < len(content):
            return reference
    if len(content) > DIGEST_OVER_CHARS:
        return digest(str(function.get("name") or "tool"), function.get("arguments"), content)
    return content


_EXIT_CODE = re.compile(r"(?i)\bexit(?:[ _-]?code|[ _-]?status)?[\"']?\s*[:=]?\s*(-?\d+)\b")
_ACTIONS = {
    "shell.exec": ("ran", ("command", "cmd")),
    "file.read": ("read", ("path", "file_path", "file")),
    "file.write": ("wrote", ("path", "file_path", "file")),
    "file.patch": ("patched", ("path", "file_path", "file")),
    "file.search": ("searched", ("pattern", "query", "regex")),
    "web.fetch": ("fetched", ("url",)),
}


def digest(name: str, arguments: object, output: str) -> str:
    """`[shell.exec] ran "pytest" -> exit 0, 212 lines` for a tool output that is no longer
    worth its size: the call's name and main argument, then exit code, line count and (when
    there is no exit code) the first non-empty line."""
    canonical = name if "." in name else name.replace("_", ".", 1)
    verb, keys = _ACTIONS.get(canonical, ("called", ()))
    args = _parse_object(arguments)
    shown = canonical if canonical in _ACTIONS else name
    key = next((k for k in keys if k in args), None)
    if key is None and verb == "called" and args:
        key = next(iter(args))
        verb = f"called with {key}="
    what = "" if key is None else _quote(args[key])
    lines = output.count("\n") + (0 if output.endswith("\n") else 1)
    facts = [f"{lines} line{'' if lines == 1 else 's'}"]
    if (code := _EXIT_CODE.search(output)) is not None:
        facts.insert(0, f"exit {code.group(1)}")
    else:
        first = next((ln.strip() for ln in output.splitlines() if ln.strip()), "")
        facts.append(f"first: {_quote(first)}")
    sep = "" if verb.endswith("=") or not what else " "
    return f"[{shown}] {verb}{sep}{what} -> {', '.join(facts)}"


def _parse_object(arguments: object) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else None
    except (ValueError, RecursionError):  # a model's malformed or absurdly nested arguments
        return {}
    return value if isinstance(value, dict) else {}


def _quote(value: object, limit: int = 60) -> str:
    try:
        text = value if isinstance(value, str) else json.dumps(value)
    except (ValueError, RecursionError):
        text = f"[{type(value).__name__}]"
    text = " ".join(text.split())
    return json.dumps(text if len(text) <= limit else text[: limit - 1] + "…", ensure_ascii=False)


def _shorten_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    arguments = function["arguments"]
    if len(arguments) <= LARGE_ARGUMENTS_CHARS:
        return call
    try:
        shortened = json.dumps(_shorten_value(json.loads(arguments)), ensure_ascii=False)
    except (ValueError, RecursionError):  # not JSON, or nested too deep to walk
        shortened = json.dumps({"truncated_arguments": _shorten_value(arguments)})
    return {**call, "function": {**function, "arguments": shortened}}


SHORTEN_MAX_DEPTH = 64


def _shorten_value(value: Any, depth: int = 0) -> Any:
    """`value` with long strings cut. Raises ValueError past `SHORTEN_MAX_DEPTH` levels,
    well before Python's recursion limit (history from before the loop bounded depth)."""
    if isinstance(value, str) and len(value) > ARGUMENT_STRING_KEEP_CHARS:
        cut = len(value) - ARGUMENT_STRING_KEEP_CHARS
        return f"{value[:ARGUMENT_STRING_KEEP_CHARS]}…[{cut} characters pruned]"
    if isinstance(value, dict | list) and depth >= SHORTEN_MAX_DEPTH:
        raise ValueError("arguments nested too deeply to shorten")
    if isinstance(value, dict):
        return {k: _shorten_value(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_shorten_value(v, depth + 1) for v in value]
    return value


# ---------------------------------------------------------------------------------------------
# The summariser's request and its answer

_INSTRUCTIONS = (
    "You compact the memory of an autonomous agent that is in the middle of a task. The agent "
    "will continue from your summary alone, together with its first exchange and its most recent "
    "messages, so keep everything it needs to carry on and nothing it does not.\n\n"
    "Answer with exactly these Markdown sections, in this order:\n"
    + "\n".join(f"## {s}" for s in SECTIONS)
    + "\n\nBe factual and specific: keep file paths, commands, identifiers, error messages, "
    "numbers and decisions (with their reasons) exactly as they appear. Record tool calls that "
    "were still in progress. Write 'none' under a section with nothing to say. Do not invent "
    f"anything, do not address the user, and never reproduce secrets (they appear as {REDACTED})."
)
_NEW = "Summarise this part of the agent's conversation."
_UPDATE = (
    "Below is the summary written at the previous compaction, then the conversation that "
    "followed it. UPDATE the summary: keep what is still true, move finished work to "
    "'Completed actions', replace state that changed, drop what is obsolete, and add what is "
    "new. Answer with the whole updated summary, not a summary of the summary."
)


def summary_request(
    middle: Sequence[Message], previous_summary: str | None = None
) -> list[Message]:
    """Messages for the summariser. With no `previous_summary` given, an earlier summary
    marker in `middle` is used; either way it is updated rather than summarised again.
    Everything the summariser sees has passed through `redact`."""
    if previous_summary is None:
        previous_summary = find_previous_summary(middle)
    transcript = "\n\n".join(_render(m) for m in middle if not is_summary(m))
    parts = [_UPDATE if previous_summary else _NEW]
    if previous_summary:
        parts.append(f"<previous-summary>\n{previous_summary}\n</previous-summary>")
    parts.append(f"<conversation>\n{transcript}\n</conversation>")
    return [
        {"role": "system", "content": _INSTRUCTIONS},
        {"role": "user", "content": redact("\n\n".join(parts))},
    ]


def find_previous_summary(messages: Iterable[Message]) -> str | None:
    """The text of the latest summary marker among `messages`, if any (without the request
    it quoted: the new marker quotes the request of its own time)."""
    found = None
    for message in messages:
        if is_summary(message):
            text = str(message["content"])[len(SUMMARY_PREFIX) :]
            found = text.split(f"\n{REQUEST_HEADING}\n", 1)[0].strip()
    return found


def _render(message: Message) -> str:
    role = str(message.get("role", "unknown")).upper()
    if role == "TOOL":
        role = f"TOOL RESULT (call {message.get('tool_call_id')})"
    lines = [f"{role}: {_clip(_text(message.get('content')))}"]
    for call in _tool_calls(message):
        function = call.get("function") or {}
        arguments = _clip(str(function.get("arguments") or ""))
        lines.append(f"TOOL CALL {function.get('name')} (call {call.get('id')}): {arguments}")
    return "\n".join(lines)


def _clip(text: str, limit: int = TRANSCRIPT_MESSAGE_MAX_CHARS) -> str:
    if len(text) <= limit:
        return text
    keep = limit // 2
    return f"{text[:keep]}\n…[{len(text) - 2 * keep} characters omitted]…\n{text[-keep:]}"


def marker_text(summary: str, request: Message | None) -> str:
    """What the summary marker says: the summary, then — when the request being worked on
    was compacted with the rest — that request word for word (its text parts)."""
    if request is None:
        return summary.strip()
    return f"{summary.strip()}\n\n{REQUEST_HEADING}\n{_text(request.get('content'))}"


def summary_message(summary: str) -> Message:
    """The marker that stands in for the compacted range."""
    return {"role": "user", "content": f"{SUMMARY_PREFIX}\n{summary.strip()}"}


def apply(parts: Split, summary: str) -> list[Message]:
    if not parts.middle:
        raise ValueError("nothing to compact: the middle is empty")
    return [*parts.head, summary_message(summary), *parts.tail]


# ---------------------------------------------------------------------------------------------
# Redaction

_CREDENTIAL_NAME = (
    r"[\w.\-]*(?:password|passwd|passphrase|secret|token|api[_\-]?key|apikey|access[_\-]?key"
    r"|private[_\-]?key|credentials?)"
)
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(
            r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?"
            r"(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)"
        ),
        REDACTED,
    ),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"), REDACTED),
    (re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), REDACTED),
    (
        re.compile(
            r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_\w{30,}|xox[abprs]-[\w\-]{10,}"
            r"|AIza[\w\-]{30,}|glpat-[\w\-]{20,})"
        ),
        REDACTED,
    ),
    (re.compile(r"\beyJ[\w\-]{8,}\.[\w\-]{8,}\.[\w\-]{8,}"), REDACTED),
    (
        re.compile(
            r"(?i)\b(authorization\s*[\"']?\s*[:=]\s*[\"']?)"
            r"(?:(?:bearer|basic|token|digest)\s+)?(?!\[redacted)[^\s\"',;]+"
        ),
        r"\1" + REDACTED,
    ),
    (re.compile(r"(?i)\b(bearer\s+)(?!\[redacted)[\w.~+/=\-]{8,}"), r"\1" + REDACTED),
    (re.compile(r"(://[^/\s:@]+:)[^/\s@]+(@)"), r"\1" + REDACTED + r"\2"),
    (
        re.compile(
            rf"(?i)\b({_CREDENTIAL_NAME})\b([\"']?\s*[:=]\s*)(?!\[redacted)"
            r"(\"[^\"\n]*\"|'[^'\n]*'|[^\s\"',;&}\]]+)"
        ),
        r"\1\2" + REDACTED,
    ),
)
# ASCII only: keys and tokens are, and a run of 32 Chinese characters (letters to Unicode's
# `\w`) has no ASCII word for `_redact_random` to measure (it divided by zero, and every
# compaction of a conversation in Chinese failed).
_CANDIDATE = re.compile(r"(?<![\w+/=\-])[\w+/\-]{32,}={0,2}(?![\w+/=\-])", re.ASCII)
_HEX = re.compile(r"[0-9a-fA-F]+")
_UUID = re.compile(r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")
_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


def redact(text: str) -> str:
    """Replace credentials with `[redacted]`: PEM private keys, `sk-…` keys, AWS key ids,
    GitHub/Slack/Google/GitLab tokens, JWTs, Authorization and Bearer values, passwords in
    URLs, `password=…` / `token: …` / `api_key …` style assignments, and long high-entropy
    strings (hex or base64, 32+ characters)."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return _CANDIDATE.sub(_redact_random, text)


def _redact_random(match: re.Match[str]) -> str:
    token = match.group(0)
    if _UUID.fullmatch(token):  # ids of sessions, calls and requests, not credentials
        return token
    if _HEX.fullmatch(token):
        return REDACTED if _entropy(token) >= 2.8 else token
    if not any(c.isalpha() for c in token):
        return token
    # Identifiers and paths are made of words; random base64 is not. Over 10,000 random
    # 32-character keys the mean word length stays under 3.6, over names it is 3.9 and up.
    words = _WORD.findall(token)
    mean_word = sum(map(len, words)) / len(words)
    return REDACTED if mean_word < 3.5 and _entropy(token) >= 3.5 else token


def _entropy(text: str) -> float:
    counts = Counter(text)
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


# ---------------------------------------------------------------------------------------------
# When compaction may run


@dataclass
class CompactionGovernor:
    """Compaction's state across one runner activation. Times are `now` values the caller
    passes (a monotonic clock), so the rules are deterministic to test.

    - a failed summary (timeout, error) opens a cooldown of 60 s, then 300 s, then 900 s for
      each further consecutive failure; a success resets the ladder;
    - at most `max_attempts_per_turn` attempts (successes and failures) per turn;
    - after `max_ineffective` consecutive compactions that left the prompt at or over the
      threshold, compaction stops for the rest of the activation (no thrash); the loop then
      ends the turn with that reason when the provider still reports an overflow.
    """

    max_attempts_per_turn: int = 3
    cooldowns: tuple[float, ...] = (60.0, 300.0, 900.0)
    max_ineffective: int = 2
    attempts_this_turn: int = field(default=0, init=False)
    consecutive_failures: int = field(default=0, init=False)
    ineffective: int = field(default=0, init=False)
    cooldown_until: float = field(default=-math.inf, init=False)

    def __post_init__(self) -> None:
        if not self.cooldowns or self.max_attempts_per_turn < 1 or self.max_ineffective < 1:
            raise ValueError("a governor needs a cooldown, attempts and an ineffective limit")

    @property
    def stopped(self) -> bool:
        return self.ineffective >= self.max_ineffective

    def blocked_reason(self, now: float) -> str | None:
        """Why compaction may not run now (for logs and the turn's end reason), or None."""
        if self.stopped:
            return f"stopped: {self.ineffective} compactions did not get under the threshold"
        if self.attempts_this_turn >= self.max_attempts_per_turn:
            return f"{self.attempts_this_turn} attempts already made this turn"
        if now < self.cooldown_until:
            return f"cooling down for {self.cooldown_until - now:.0f} s after a failed summary"
        return None

    def may_compact(self, now: float) -> bool:
        return self.blocked_reason(now) is None

    def record_success(self, tokens_after: int, threshold: int) -> None:
        self.attempts_this_turn += 1
        self.consecutive_failures = 0
        self.cooldown_until = -math.inf
        self.ineffective = self.ineffective + 1 if tokens_after >= threshold else 0

    def record_failure(self, now: float) -> None:
        self.attempts_this_turn += 1
        self.consecutive_failures += 1
        step = min(self.consecutive_failures, len(self.cooldowns)) - 1
        self.cooldown_until = now + self.cooldowns[step]

    def new_turn(self) -> None:
        self.attempts_this_turn = 0
