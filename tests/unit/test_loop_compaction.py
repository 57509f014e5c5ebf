"""Compaction pieces: measure, split, prune, summariser request, redaction, governor
(DESIGN.md §9, Appendix A)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suzumio.runner.loop import compaction
from suzumio.runner.loop.compaction import (
    REQUEST_HEADING,
    SECTIONS,
    SUMMARY_PREFIX,
    CompactionGovernor,
    Message,
    Split,
    apply,
    at_most,
    digest,
    estimate_tokens,
    find_previous_summary,
    marker_text,
    prune,
    redact,
    split,
    summary_message,
    summary_request,
    threshold_tokens,
)

SYSTEM: Message = {"role": "system", "content": "You are a coding agent."}


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def say(text: str) -> Message:
    return {"role": "assistant", "content": text}


def call(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


def ask(*calls: dict[str, Any], text: str | None = None) -> Message:
    return {"role": "assistant", "content": text, "tool_calls": list(calls)}


def result(call_id: str, text: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def rounds(count: int, start: int = 0, size: int = 400) -> list[Message]:
    """`count` tool rounds of one shell call each, outputs `size` characters long."""
    out: list[Message] = []
    for i in range(start, start + count):
        out += [
            ask(call(f"c{i}", "shell_exec", command=f"step {i}")),
            result(f"c{i}", f"exit code: 0\n{f'line {i} ' * (size // 8)}"),
        ]
    return out


FIRST_EXCHANGE = [
    SYSTEM,
    user("Fix the failing tests."),
    ask(call("c-first", "file_read", path="README.md")),
    result("c-first", "# Project\n" + "readme text " * 40),
]


def conversation(count: int = 30, size: int = 400) -> list[Message]:
    return [*FIRST_EXCHANGE, *rounds(count, size=size), say("All tests pass now.")]


# ---------------------------------------------------------------------------------------------
# Measuring

ESTIMATES = {
    "nothing": ([], 0),
    "four characters are one token plus the overhead": ([user("abcd")], 5),
    "partial tokens round up": ([user("abcde")], 6),
    "no content is the overhead alone": ([ask(text=None)], 4),
    "tool calls count their id, name and arguments": (
        [{"role": "assistant", "content": None, "tool_calls": [call("ab", "cd", x=1)]}],
        4 + 3,  # "ab" + "cd" + '{"x": 1}' = 12 characters
    ),
    "tool results count their call id": ([result("abcd", "abcd")], 4 + 2),
    "image parts count a flat amount": (
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "abcd"},
                    {"type": "image_url", "image_url": {"url": "data:" + "A" * 10_000}},
                ],
            }
        ],
        4 + 1 + 1024,
    ),
}


@pytest.mark.parametrize(("messages", "expected"), ESTIMATES.values(), ids=ESTIMATES.keys())
def test_estimate_tokens(messages, expected):
    assert estimate_tokens(messages) == expected


@settings(max_examples=300)
@given(
    st.sampled_from(["system", "user", "assistant"]),
    st.text(max_size=50),
    st.sampled_from([{}, {"name": "n"}, {"tool_calls": None}, {"tool_call_id": None}]),
)
def test_a_text_message_counts_as_any_message(role: str, text: str, more: dict[str, Any]) -> None:
    """Plain text messages take a shorter way (`compaction._tokens`): the same count."""
    message: Message = {"role": role, "content": text, **more}
    assert estimate_tokens([message]) == compaction._any_tokens(message)


@pytest.mark.parametrize(
    ("window", "max_output", "ratio", "expected"),
    [(128_000, 8_000, 0.5, 60_000), (200_000, 0, 0.8, 160_000), (4_000, 8_000, 0.5, 0)],
)
def test_threshold_tokens(window, max_output, ratio, expected):
    assert threshold_tokens(window, max_output, ratio) == expected


def test_threshold_rejects_a_bad_ratio():
    with pytest.raises(ValueError, match="ratio"):
        threshold_tokens(1000, 0, 0)


# ---------------------------------------------------------------------------------------------
# Split


def test_split_keeps_the_first_exchange_and_a_tail():
    messages = conversation()
    parts = split(messages, threshold=2000)

    assert [*parts.head, *parts.middle, *parts.tail] == messages
    assert list(parts.head) == FIRST_EXCHANGE
    assert len(parts.tail) >= 8
    assert estimate_tokens(parts.tail[2:]) <= 0.2 * 2000 < estimate_tokens(parts.tail)
    assert parts.tail[0]["role"] == "assistant"
    assert parts.tail[-1] == say("All tests pass now.")
    assert parts.middle


def test_the_work_after_the_last_user_message_can_be_compacted_and_the_request_is_quoted():
    """A session's second activation: its request comes after the earlier history, and the
    activation's own work after it. Pinning the tail to the request put all that work beyond
    compaction (a long activation outgrew the window, and failed so at every retry): the
    request is quoted word for word in the summary marker instead."""
    late = user("Also update the changelog.")
    messages = [*FIRST_EXCHANGE, *rounds(4), late, *rounds(30, start=4), say("Done.")]
    parts = split(messages, threshold=0)
    assert late in parts.middle
    assert parts.request is late
    assert len(parts.middle) > parts.middle.index(late) + 40  # most of its work compacted
    text = marker_text("## Goal\nthe changelog", parts.request)
    assert text == f"## Goal\nthe changelog\n\n{REQUEST_HEADING}\nAlso update the changelog."
    compacted = apply(parts, text)
    # Compacted again later: the summariser is given the summary, not the quoted request
    # (the new marker quotes the request of its time).
    assert find_previous_summary(compacted) == "## Goal\nthe changelog"


def test_a_second_compaction_quotes_the_request_the_first_one_quoted():
    """The request lives on only as the first marker's quote: the marker that replaces it
    quotes it again (its words were lost to the second summary)."""
    late = user("Also update the changelog.")
    messages = [*FIRST_EXCHANGE, *rounds(4), late, *rounds(30, start=4), say("Done.")]
    parts = split(messages, threshold=0)
    once = apply(parts, marker_text("## Goal\nthe changelog", parts.request))
    grown = [*once, *rounds(30, start=100), say("Still going.")]
    again = split(grown, threshold=0)
    assert again.middle[0] == once[len(parts.head)]  # the first marker is compacted now
    assert again.request == {"role": "user", "content": "Also update the changelog."}
    # A newer request in the tail is the one worked on: the old quote is not carried.
    newer = [*once, user("Now the README."), *rounds(2, start=100), say("Done.")]
    assert split(newer, threshold=0).request is None


def test_a_request_in_the_tail_is_not_quoted():
    late = user("Also update the changelog.")
    messages = [*FIRST_EXCHANGE, *rounds(20), late, *rounds(2, start=20), say("Done.")]
    parts = split(messages, threshold=0)
    assert late in parts.tail
    assert parts.request is None
    assert marker_text(" summary ", parts.request) == "summary"


def test_a_task_in_the_head_does_not_pin_the_tail():
    parts = split(conversation(), threshold=0)
    assert len(parts.tail) == 9  # the last 8 messages, widened to keep a round whole
    assert parts.middle


def test_a_cut_never_separates_a_call_from_its_results():
    group = [
        ask(call("a", "file_read", path="x"), call("b", "file_read", path="y"), call("c", "z")),
        result("a", "1"),
        result("b", "2"),
        result("c", "3"),
    ]
    messages = [*FIRST_EXCHANGE, *rounds(5), *group, say("done")]
    parts = split(messages, threshold=0, min_tail_messages=2)  # would start at result "c"
    assert list(parts.tail) == [*group, say("done")]


def test_a_middle_too_long_for_one_marker_is_cut_where_no_call_is_parted_from_its_result():
    """A marker archives 10,000 entries at most: a longer middle failed to become one, and
    every activation of the session crashed at its first compaction. The rest of the middle
    waits in the tail, for the next."""
    messages = [*FIRST_EXCHANGE, *rounds(40), user("and now?"), say("done")]
    parts = split(messages, threshold=0, min_tail_messages=2)
    assert len(parts.middle) > 41

    capped = at_most(messages, parts, 41)  # 41 would part call c20 from its result
    assert len(capped.middle) == 40
    assert [*capped.head, *capped.middle, *capped.tail] == messages
    assert capped.middle[-1]["role"] == "tool"  # a whole round last
    assert capped.tail[0]["role"] == "assistant"
    assert capped.request is None  # the request is in the tail now: not quoted
    assert at_most(messages, parts, len(parts.middle)) == parts


def test_a_short_conversation_has_nothing_to_compact():
    messages = [*FIRST_EXCHANGE, *rounds(2), say("done")]
    parts = split(messages, threshold=100_000)
    assert parts.middle == ()
    assert [*parts.head, *parts.tail] == messages
    with pytest.raises(ValueError, match="nothing to compact"):
        apply(parts, "summary")


def test_a_lone_earlier_summary_is_nothing_to_compact():
    messages = [*FIRST_EXCHANGE, summary_message("old"), *rounds(4), say("done")]
    parts = split(messages, threshold=0)
    assert parts.middle == ()
    assert [*parts.head, *parts.tail] == messages


def test_a_summary_marker_is_not_the_last_user_message():
    compacted = [*FIRST_EXCHANGE, summary_message("S1"), *rounds(20), say("done")]
    parts = split(compacted, threshold=0)
    assert parts.middle[0] == summary_message("S1")
    assert len(parts.middle) > 1


def test_apply_then_compact_again_updates_the_summary():
    parts = split(conversation(), threshold=2000)
    once = apply(parts, "Goal: fix the tests.")
    assert once == [*parts.head, summary_message("Goal: fix the tests."), *parts.tail]
    assert find_previous_summary(once) == "Goal: fix the tests."

    grown = [*once[:-1], *rounds(20, start=100), say("still going")]
    again = split(grown, threshold=2000)
    assert again.head == parts.head
    assert again.middle[0]["content"].startswith(SUMMARY_PREFIX)
    request = summary_request(again.middle)
    assert "UPDATE" in request[1]["content"]
    assert "Goal: fix the tests." in request[1]["content"]


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    messages: list[Message] = [SYSTEM]
    if draw(st.booleans()):
        messages.append({"role": "system", "content": "Project facts."})
    messages.append(user("task"))
    ids = iter(range(1000))
    for _ in range(draw(st.integers(0, 30))):
        kind = draw(st.sampled_from(["tools", "tools", "tools", "text", "user", "summary"]))
        if kind == "tools":
            calls = [call(f"c{next(ids)}", "shell_exec") for _ in range(draw(st.integers(1, 4)))]
            messages.append(ask(*calls))
            sizes = st.integers(0, 1200)
            messages += [result(c["id"], "o" * draw(sizes)) for c in calls]
        elif kind == "text":
            messages.append(say("t" * draw(st.integers(0, 800))))
        elif kind == "user":
            messages.append(user("u" * draw(st.integers(1, 400))))
        else:
            messages.append(summary_message("earlier"))
    return messages


def owner_of(messages: list[Message]) -> dict[int, int]:
    """Tool message index -> index of the assistant message that made the call."""
    made = {c["id"]: i for i, m in enumerate(messages) for c in m.get("tool_calls") or []}
    return {i: made[m["tool_call_id"]] for i, m in enumerate(messages) if m["role"] == "tool"}


def last_index(messages: list[Message], role: str) -> int | None:
    found = [
        i
        for i, m in enumerate(messages)
        if m["role"] == role and not str(m.get("content") or "").startswith(SUMMARY_PREFIX)
    ]
    return found[-1] if found else None


@settings(max_examples=300, deadline=None)
@given(conversations(), st.integers(0, 20_000), st.integers(1, 12))
def test_split_properties(messages, threshold, min_tail):
    parts = split(messages, threshold, min_tail_messages=min_tail)
    assert [*parts.head, *parts.middle, *parts.tail] == messages

    bounds = (len(parts.head), len(parts.head) + len(parts.middle))

    def part(i: int) -> int:
        return sum(i >= b for b in bounds)

    for tool_index, assistant_index in owner_of(messages).items():
        assert part(tool_index) == part(assistant_index), "a call was split from its result"
    systems = 1 + (messages[1]["role"] == "system")
    assert [m["role"] for m in parts.head[:systems]] == ["system"] * systems
    assert len(parts.tail) >= min(min_tail, len(messages) - len(parts.head))
    last = last_index(messages, "assistant")
    if last is not None and last >= len(parts.head):
        assert last >= bounds[1], "the last assistant message is not in the tail"
    last = last_index(messages, "user")
    if last is not None and len(parts.head) <= last < bounds[1]:
        assert parts.request is messages[last], "the last user message is neither kept nor quoted"
    else:
        assert parts.request is None
    if parts.middle:
        assert any(not str(m["content"]).startswith(SUMMARY_PREFIX) for m in parts.middle)


# ---------------------------------------------------------------------------------------------
# Prune


def test_prune_digests_old_outputs_and_leaves_head_and_tail_alone():
    messages = conversation(count=20)
    original = copy.deepcopy(messages)
    pruned = prune(messages)
    parts = split(messages, threshold=0)
    middle = range(len(parts.head), len(parts.head) + len(parts.middle))

    assert messages == original, "the input is not modified"
    assert len(pruned) == len(messages)
    for i, (before, after) in enumerate(zip(messages, pruned, strict=True)):
        if i not in middle:
            assert after is before
        elif before["role"] == "tool":
            assert after["content"].startswith("[shell.exec] ran ")
            assert after["tool_call_id"] == before["tool_call_id"]
    step = pruned[middle[1]]["content"]
    assert step == '[shell.exec] ran "step 0" -> exit 0, 2 lines'
    assert estimate_tokens(pruned) < estimate_tokens(messages)


def test_prune_with_a_threshold_protects_the_same_tail_as_split():
    messages = conversation(count=30)
    parts = split(messages, threshold=3000)
    pruned = prune(messages, 3000)
    assert pruned[-len(parts.tail) :] == list(parts.tail)
    middle = slice(len(parts.head), len(messages) - len(parts.tail))
    assert pruned[: len(parts.head)] == list(parts.head)
    assert pruned[middle] != messages[middle]


def test_duplicate_outputs_become_back_references():
    same = "same output\n" * 30
    messages = [
        *FIRST_EXCHANGE,
        ask(call("d1", "file_read", path="a.py")),
        result("d1", same),
        ask(call("d2", "file_read", path="a.py")),
        result("d2", same),
        *rounds(8),
        say("done"),
    ]
    pruned = prune(messages)
    assert pruned[5]["content"] == '[file.read] read "a.py" -> 30 lines, first: "same output"'
    assert pruned[7]["content"] == "[same output as call d1 above]"


def test_short_outputs_are_kept():
    messages = [*FIRST_EXCHANGE, *rounds(6, size=40), say("done")]
    assert prune(messages) == messages


def test_huge_arguments_are_shortened_inside_valid_json():
    body = "x" * 5000
    messages = [
        *FIRST_EXCHANGE,
        ask(call("w1", "file_write", path="big.txt", content=body, lines=["y" * 300, 7])),
        result("w1", "ok"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "w2",
                    "type": "function",
                    "function": {"name": "file_write", "arguments": '{"path": "b", ' + body},
                }
            ],
        },
        result("w2", "error: unparseable arguments"),
        *rounds(8),
        say("done"),
    ]
    pruned = prune(messages)

    args = json.loads(pruned[4]["tool_calls"][0]["function"]["arguments"])
    assert args["path"] == "big.txt"
    assert args["content"].startswith("x" * 200)
    assert args["content"].endswith("[4800 characters pruned]")
    assert args["lines"][0].endswith("[100 characters pruned]")
    assert args["lines"][1] == 7
    broken = json.loads(pruned[6]["tool_calls"][0]["function"]["arguments"])
    assert broken["truncated_arguments"].startswith('{"path": "b", xxx')
    assert len(messages[4]["tool_calls"][0]["function"]["arguments"]) > 5000, "input untouched"


@settings(max_examples=200, deadline=None)
@given(conversations())
def test_prune_keeps_the_structure(messages):
    pruned = prune(messages)
    assert [(m["role"], m.get("tool_call_id")) for m in pruned] == [
        (m["role"], m.get("tool_call_id")) for m in messages
    ]
    assert owner_of(pruned) == owner_of(messages)
    for m in pruned:
        for c in m.get("tool_calls") or []:
            json.loads(c["function"]["arguments"])


DIGESTS = {
    "shell with exit code": (
        "shell_exec",
        '{"command": "pytest"}',
        "collected 5 items\n" * 211 + "exit code: 0",
        '[shell.exec] ran "pytest" -> exit 0, 212 lines',
    ),
    "exit code in JSON output": (
        "shell.exec",
        '{"command": "make"}',
        '{"exit_code": 2, "stdout": "..."}',
        '[shell.exec] ran "make" -> exit 2, 1 line',
    ),
    "file read shows the first line": (
        "file_read",
        '{"path": "src/app.py"}',
        "\nimport os\nimport sys\n",
        '[file.read] read "src/app.py" -> 3 lines, first: "import os"',
    ),
    "search": (
        "file_search",
        '{"pattern": "TODO"}',
        "a.py:1: TODO",
        '[file.search] searched "TODO" -> 1 line, first: "a.py:1: TODO"',
    ),
    "unknown tool names its first argument": (
        "my_tool",
        '{"query": "weather"}',
        "sunny",
        '[my_tool] called with query="weather" -> 1 line, first: "sunny"',
    ),
    "unparseable arguments": (
        "web_fetch",
        "{not json",
        "<html>",
        '[web.fetch] fetched -> 1 line, first: "<html>"',
    ),
    "long commands are cut": (
        "shell_exec",
        json.dumps({"command": "echo " + "a" * 100}),
        "exit 1",
        '[shell.exec] ran "echo ' + "a" * 54 + '…" -> exit 1, 1 line',
    ),
}


@pytest.mark.parametrize(("name", "arguments", "output", "expected"), DIGESTS.values(), ids=DIGESTS)
def test_digest(name, arguments, output, expected):
    assert digest(name, arguments, output) == expected


# ---------------------------------------------------------------------------------------------
# The summariser's request


def test_summary_request_asks_for_the_sections():
    middle = rounds(3)
    request = summary_request(middle)
    assert [m["role"] for m in request] == ["system", "user"]
    for section in SECTIONS:
        assert f"## {section}" in request[0]["content"]
    assert "UPDATE" not in request[1]["content"]
    assert "TOOL CALL shell_exec (call c1)" in request[1]["content"]
    assert "TOOL RESULT (call c2): exit code: 0" in request[1]["content"]


def test_summary_request_updates_an_explicit_previous_summary():
    request = summary_request(rounds(2), previous_summary="Goal: ship it.")
    assert "UPDATE" in request[1]["content"]
    assert "<previous-summary>\nGoal: ship it.\n</previous-summary>" in request[1]["content"]


def test_summary_request_does_not_summarise_the_marker_itself():
    request = summary_request([summary_message("Goal: ship it."), *rounds(1)])
    content = request[1]["content"]
    assert content.count("Goal: ship it.") == 1
    assert SUMMARY_PREFIX not in content


def test_summary_request_redacts_secrets_and_clips_long_messages():
    key = "sk-proj-" + "Ab1" * 12
    middle = [
        ask(call("k1", "shell_exec", command=f"curl -H 'Authorization: Bearer {key}' x")),
        result("k1", "OPENAI_API_KEY=" + key + "\n" + "z" * 10_000),
    ]
    text = json.dumps(summary_request(middle))
    assert key not in text
    assert "[redacted]" in text
    assert "characters omitted" in text


def test_summary_message_and_find_previous_summary():
    marker = summary_message("  the summary \n")
    assert marker == {"role": "user", "content": f"{SUMMARY_PREFIX}\nthe summary"}
    assert find_previous_summary([user("x"), marker, say("y")]) == "the summary"
    assert find_previous_summary([user(f"not {SUMMARY_PREFIX}")]) is None


def test_apply_puts_the_marker_between_head_and_tail():
    parts = Split((SYSTEM,), (user("old"),), (say("new"),))
    assert apply(parts, "S") == [SYSTEM, summary_message("S"), say("new")]


# ---------------------------------------------------------------------------------------------
# Redaction

SECRETS = {
    "OpenAI key": ("key is sk-proj-AbCdEf0123456789abcdef here", "sk-proj-AbCdEf0123456789abcdef"),
    "Anthropic key": ("sk-ant-api03-abcDEF123456789_-xyz", "abcDEF123456789"),
    "Bearer token": ("curl -H 'x: Bearer abcdefgh12345678' url", "abcdefgh12345678"),
    "Authorization header": ("Authorization: Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),
    "AWS key id": ("aws AKIAIOSFODNN7EXAMPLE ok", "AKIAIOSFODNN7EXAMPLE"),
    "AWS secret assignment": (
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "wJalrXUtnFEMI",
    ),
    "PEM private key": (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
        "MIIEowIBAAKCAQEA",
    ),
    "PEM private key cut off by an output cap": (
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA",
        "b3BlbnNzaC1rZXktdjEAAAAA",
    ),
    "password assignment": ("login password=hunter2 ok", "hunter2"),
    "token assignment": ("token: abc.def", "abc.def"),
    "api_key in JSON": ('{"api_key": "s3cr3t-value", "n": 1}', "s3cr3t-value"),
    "environment variable": ("export GITHUB_TOKEN=ghp_abc", "ghp_abc"),
    "GitHub token alone": ("ghp_" + "a1B2" * 9, "a1B2a1B2"),
    "password in a URL": ("git clone https://me:pa55word@host/repo", "pa55word"),
    "JWT": ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJl", "eyJzdWIi"),
    "long hex": (
        "digest 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "9f86d0",
    ),
    "long base64": ("blob q8Zr3LmN0pXv7Tb2Yw9Ks4Hd1Fg6Jc5Ue8Ra0Bo", "q8Zr3LmN0pXv"),
}


@pytest.mark.parametrize(("text", "secret"), SECRETS.values(), ids=SECRETS.keys())
def test_redact_catches(text, secret):
    redacted = redact(text)
    assert secret not in redacted
    assert "[redacted]" in redacted
    assert redact(redacted) == redacted


KEPT = {
    "a path": "/srv/app/runner/src/suzumio/runner/loop/compaction.py",
    "a long identifier": "test_compaction_never_splits_tool_calls_from_results",
    "a camel-case name with a digit": "TestCompactionNeverSplitsToolCalls2Results",
    "a UUID": "123e4567-e89b-12d3-a456-426614174000",
    "a short hash": "commit 3f78685",
    "token counts": "max_tokens: 4096, tokens_used=12",
    "prose about passwords": "the password field is required",
    "a repeated hex pattern": "00000000000000000000000000000000000000",
}


@pytest.mark.parametrize("text", KEPT.values(), ids=KEPT.keys())
def test_redact_keeps(text):
    assert redact(text) == text


# ---------------------------------------------------------------------------------------------
# Governor

# (event, now, may_compact afterwards at that same `now`); "turn" starts a new turn.
COOLDOWN_LADDER = [
    ("fail", 0, False),
    ("check", 59.9, False),
    ("check", 60, True),
    ("fail", 60, False),
    ("check", 359.9, False),
    ("check", 360, True),
    ("fail", 360, False),  # third attempt this turn as well
    ("turn", 1259.9, False),
    ("check", 1260, True),
    ("fail", 1260, False),  # the ladder stays at its last step
    ("check", 2159.9, False),
    ("check", 2160, True),
]


def test_failed_summaries_cool_down_60_300_900():
    governor = CompactionGovernor()
    for event, now, expected in COOLDOWN_LADDER:
        if event == "fail":
            governor.record_failure(now)
        elif event == "turn":
            governor.new_turn()
        assert governor.may_compact(now) is expected, (event, now)


def test_a_success_resets_the_ladder():
    governor = CompactionGovernor()
    governor.record_failure(0)
    governor.record_failure(60)
    governor.new_turn()
    governor.record_success(tokens_after=10, threshold=100)
    assert governor.may_compact(61)
    governor.record_failure(100)
    assert governor.may_compact(160)


def test_at_most_three_attempts_per_turn():
    governor = CompactionGovernor()
    for _ in range(3):
        assert governor.may_compact(0)
        governor.record_success(tokens_after=10, threshold=100)
    assert not governor.may_compact(0)
    assert "3 attempts" in (governor.blocked_reason(0) or "")
    governor.new_turn()
    assert governor.may_compact(0)


@pytest.mark.parametrize(
    ("outcomes", "stopped"),
    [
        ([150], False),
        ([150, 150], True),
        ([100, 100], True),  # at the threshold is not under it
        ([150, 50, 150], False),  # only consecutive ineffective compactions count
        ([150, 50, 150, 150], True),
    ],
)
def test_no_thrash(outcomes, stopped):
    governor = CompactionGovernor()
    for tokens_after in outcomes:
        governor.new_turn()
        governor.record_success(tokens_after=tokens_after, threshold=100)
    governor.new_turn()
    assert governor.stopped is stopped
    assert governor.may_compact(10_000) is not stopped
    if stopped:
        assert "did not get under the threshold" in (governor.blocked_reason(10_000) or "")


def test_governor_settings_are_checked():
    with pytest.raises(ValueError, match="governor"):
        CompactionGovernor(cooldowns=())
