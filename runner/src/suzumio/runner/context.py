"""What the model sees: the prompt layers, the history and the signals, as chat messages.

The system prompt has three layers built once per activation — stable (identity, tool rules),
context (project, workspace, toolpacks, the agent package's assets and env facts) and volatile
(time, this activation's instructions) — and stays byte-identical across the activation's
model calls so provider prompt caches hit; its hash is reported with the output. New
information enters as messages, never by rewriting earlier ones (DESIGN.md §9).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from suzumio.contracts.policies import wire_name
from suzumio.contracts.runner import (
    ASSETS_DIR,
    AgentHistoryMessage,
    RunnerActivationInput,
    SignalSpec,
)
from suzumio.contracts.values import SignalKind

Message = dict[str, Any]
UNFINISHED = "(no result: the activation ended before the call finished)"
# A tool call's id as every provider of the chain takes it back: OpenAI refuses ids over 40
# characters (vLLM's are 46), Anthropic's compatible endpoint any but these characters.
WIRE_CALL_ID = re.compile(r"[A-Za-z0-9_-]{1,40}")

TOOL_RULES = (
    "Use the tools to act; do not describe actions you could take with them. Paths are "
    "relative to the workspace. Tool results come back in the order of your calls. When the "
    "work is done, answer with the result (or call activation_complete)."
)


ENV_FACTS_HEAD = "Facts about your environment (from your agent package; name: value):"
MAX_LISTED_ASSETS = 50  # named in the prompt; the rest are counted


@dataclass(frozen=True)
class Prompt:
    text: str
    hash: str


def build_prompt(spec: RunnerActivationInput, now: datetime | None = None) -> Prompt:
    stable = [
        f"You are {spec.agent.role}.",
        spec.agent.prompt.strip(),
        TOOL_RULES,
    ]
    toolpacks = ", ".join(t.name for t in spec.toolpacks) or "none"
    context = [
        f"Project: {spec.project.name}. Session: {spec.session.id}.",
        (
            f"Workspace: {spec.workspace} (session-level files under {spec.workspace}/session; "
            f"files you leave in {spec.workspace}/out become artifacts of the session)."
        ),
        f"Toolpacks: {toolpacks}.",
        *package_facts(spec),
    ]
    if spec.checkpoint is not None:
        saved = spec.checkpoint.created_at.isoformat()
        data = json.dumps(spec.checkpoint.data, ensure_ascii=False)[:20_000]
        context.append(f"Your latest checkpoint (saved {saved}): {data}")
    volatile = [f"Current time: {(now or datetime.now(UTC)).strftime('%Y-%m-%d %H:%M UTC')}."]
    if spec.activation.prompt.strip():
        volatile.append(spec.activation.prompt.strip())
    text = "\n\n".join(
        "\n".join(part for part in layer if part) for layer in (stable, context, volatile)
    )
    return Prompt(text, hashlib.sha256(text.encode()).hexdigest())


def package_facts(spec: RunnerActivationInput) -> list[str]:
    """The agent package's part of the context layer: its assets' place and its env facts,
    in a fixed order (the facts by name), so the same package gives the same bytes."""
    parts: list[str] = []
    if spec.assets:
        listed = ", ".join(ref.path for ref in spec.assets[:MAX_LISTED_ASSETS])
        more = len(spec.assets) - MAX_LISTED_ASSETS
        parts.append(
            f"Your agent package's files ({len(spec.assets)}, read-only: they are replaced "
            f"at each activation) are in {spec.workspace}/{ASSETS_DIR}: {listed}"
            + (f", and {more} more." if more > 0 else ".")
        )
    if spec.agent.env_facts:
        # One JSON string pair a line: no value can end the block early or pass for a fact.
        facts = "\n".join(
            f"{json.dumps(name, ensure_ascii=False)}: {json.dumps(value, ensure_ascii=False)}"
            for name, value in sorted(spec.agent.env_facts.items())
        )
        parts.append(f"{ENV_FACTS_HEAD}\n<env_facts>\n{facts}\n</env_facts>")
    return parts


def wire_call_id(call_id: str) -> str:
    """`call_id` as sent back to a model: itself, or (one a provider of the chain would
    refuse — recorded before the runner replaced such ids, or made by another model) one
    derived from it, the same for the call and its result."""
    if WIRE_CALL_ID.fullmatch(call_id):
        return call_id
    return "call_" + hashlib.sha256(call_id.encode()).hexdigest()[:32]


def render_history(history: Iterable[AgentHistoryMessage]) -> list[tuple[str | None, Message]]:
    """The session's active history as (entry id, message) pairs. A tool call without its
    result (the sandbox died mid-round) gets a stand-in result, because providers refuse a
    conversation with an unanswered call.

    A message posted while a tool round ran (a user's double text, another agent's message)
    is in the log between the round's calls and their results, which the runner records once
    the round is over: it comes after the results here. Taken as the end of the round, it
    gave every call of it a stand-in and dropped the real results, in every later
    activation."""
    out: list[tuple[str | None, Message]] = []
    open_calls: list[str] = []
    held: list[tuple[str | None, Message]] = []  # posted while calls were open

    def close_open() -> None:
        if not open_calls and not held:  # the usual case, once per entry
            return
        out.extend(
            (None, {"role": "tool", "tool_call_id": wire_call_id(call_id), "content": UNFINISHED})
            for call_id in open_calls
        )
        open_calls.clear()
        out.extend(held)
        held.clear()

    for entry in history:
        if entry.role == "tool":
            if entry.tool_call_id in open_calls:
                open_calls.remove(entry.tool_call_id)
                out.append(
                    (
                        entry.id,
                        {
                            "role": "tool",
                            "tool_call_id": wire_call_id(entry.tool_call_id),
                            "content": entry.content,
                        },
                    )
                )
                if not open_calls:
                    close_open()  # the round is whole: what was posted meanwhile follows
            continue  # a result whose call is not in the window: meaningless alone
        if open_calls and entry.role != "assistant":
            held.append((entry.id, {"role": entry.role, "content": entry.content}))
            continue
        close_open()
        message: Message = {"role": entry.role, "content": entry.content}
        if entry.role == "assistant" and entry.tool_calls:
            message["tool_calls"] = [
                {
                    "id": wire_call_id(c.id),
                    "type": "function",
                    "function": {"name": wire_name(c.name), "arguments": c.arguments},
                }
                for c in entry.tool_calls
            ]
            open_calls.extend(c.id for c in entry.tool_calls)
        out.append((entry.id, message))
    close_open()
    return out


def render_signal(signal: SignalSpec) -> str:
    if signal.kind in {SignalKind.USER_MESSAGE, SignalKind.MESSAGE_CREATED} and signal.text:
        return signal.text
    payload = json.dumps(signal.payload, ensure_ascii=False, sort_keys=True)[:20_000]
    match signal.kind:
        case SignalKind.APPROVAL_RESULT:
            return f"[approval result] {payload}"
        case SignalKind.NUDGE:
            return (
                "[nudge] Your last activation ended without any effect while work is still "
                "pending. Continue the work, or say why you cannot."
            )
        case _:
            if signal.payload.get("pending_action_id"):
                return f"[answer to your question] {payload}"
            return f"[signal {signal.kind.value}] {payload}"
