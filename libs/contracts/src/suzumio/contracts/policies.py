"""Tool permission policies (DESIGN.md §10): the rules the runner and the tool-broker share.

The runner applies an agent's policy to every tool call. The broker applies it again to the
tools whose effects it makes (`BROKER_TOOLS`): anything in the sandbox can reach the broker
with the activation's token (a `shell.exec` command among them), so a policy held by the runner
alone could be stepped around. The token carries the agent's policy for those tools, and a
tool under `ask` must bring the call whose approval a person gave (`approval_id`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from suzumio.contracts.ids import derived_id
from suzumio.contracts.values import ToolPolicy

BROKER_TOOLS = ("message.send", "signal.record", "ask_user", "checkpoint")
"""Core tools whose effect the broker makes: `message.send` and `signal.record` (support
operations of `core`), `ask_user` (a question or artifact request) and `checkpoint`."""

MAX_APPROVAL_ASKS = 20
"""Asks of one call's approval nobody decided, at most: walked through at each try of it."""

_STRICTNESS = (ToolPolicy.ALLOW, ToolPolicy.ASK, ToolPolicy.DENY)


def wire_name(name: str) -> str:
    """Providers allow [a-zA-Z0-9_-] in function names: `file.read` goes out as `file_read`."""
    return name.replace(".", "_")


def effective_policy(
    permissions: Mapping[str, ToolPolicy], default: ToolPolicy, tool: str
) -> ToolPolicy:
    """The policy for `tool` (canonical name). A policy may name the tool as the model sees it
    too (`shell_exec`, from a transcript): that is still the tool, and a `deny` under that name
    must not leave it allowed. Named both ways, the stricter policy holds."""
    named = [permissions[n] for n in dict.fromkeys((tool, wire_name(tool))) if n in permissions]
    if not named:
        return default
    return max(named, key=_STRICTNESS.index)


def broker_policies(
    permissions: Mapping[str, ToolPolicy], default: ToolPolicy = ToolPolicy.ALLOW
) -> dict[str, ToolPolicy]:
    """What the activation's token says of `BROKER_TOOLS`: the ones not simply allowed."""
    found = {t: effective_policy(permissions, default, t) for t in BROKER_TOOLS}
    return {t: p for t, p in found.items() if p is not ToolPolicy.ALLOW}


def arguments_digest(arguments: str) -> str:
    """The digest of a tool call's arguments as the model wrote them (JSON text)."""
    return hashlib.sha256(arguments.encode()).hexdigest()


def approval_prompt(tool: str, arguments: str) -> str:
    """What a person is asked, to approve a call: the tool and its arguments as written."""
    return f"Allow the agent to run {tool} with {arguments[:2_000]}?"


def approval_id(session_id: str, tool: str, digest: str, asked: int) -> str:
    """The pending action of the `asked`-th ask to approve a call (0: the first). The ids
    derive from the session, the tool and its arguments, so the same call asked again in a
    later activation finds the approval given to an earlier ask."""
    return derived_id("approval", session_id, tool, digest, *((str(asked),) if asked else ()))
