"""The agent's tool policy, applied again by the broker to the tools whose effect it makes.

The runner applies the policy to every call. But whatever runs in the sandbox can read the
activation's token (a `shell.exec` command among them) and call the broker past the runner, so
for `BROKER_TOOLS` the broker holds the policy too — the token carries it, signed:

- `deny`: refused (409 `denied`);
- `ask`: the call must come with its arguments as the model wrote them (`approved_call`), which
  must be this call's, and a person must have approved that call: the broker finds the
  approval's pending action by the same ids the runner asks under (`approval_id`).

Refused with 409, not 403: a runner takes a 401 or 403 for its token fenced, where a refused
call is the model's to hear about (its tool's result, `refused: …`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from suzumio.contracts.events import PendingActionAnswered, PendingActionCreated
from suzumio.contracts.policies import (
    MAX_APPROVAL_ASKS,
    approval_id,
    approval_prompt,
    arguments_digest,
)
from suzumio.contracts.values import PendingKind, ToolPolicy
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.tokens import ActivationClaims
from suzumio.toolbroker.pending import outcome_of
from suzumio.toolbroker.problems import BrokerError


async def permit(
    store: EventStore,
    claims: ActivationClaims,
    tool: str,
    approved_call: str | None,
    matches: Callable[[Any], bool],
) -> None:
    """Raise unless the agent's policy lets this call of `tool` through. `matches` tells
    whether the arguments the model wrote (parsed) are the ones this request carries out."""
    policy = claims.policies.get(tool, ToolPolicy.ALLOW)
    if policy is ToolPolicy.ALLOW:
        return
    if policy is ToolPolicy.DENY:
        raise BrokerError(409, "denied", f"{tool} is denied by this agent's policy")
    if approved_call is None:
        raise BrokerError(
            409, "approval_required", f"{tool} needs a person's approval (the agent's policy)"
        )
    try:
        written = json.loads(approved_call or "{}")  # as the runner reads no arguments
    except (ValueError, RecursionError):  # nested past the parser's limit: not JSON to us
        raise BrokerError(422, "invalid", "approved_call: not JSON text") from None
    if not matches(written):
        raise BrokerError(
            409, "approval_required", f"the approved arguments are not this {tool} call's"
        )
    if not await _approved(store, claims.session_id, tool, arguments_digest(approved_call)):
        raise BrokerError(
            409, "approval_required", f"no one approved this {tool} call (the agent's policy)"
        )


def approval_asked(session_id: str, pending_action_id: str, tool: str, arguments: str) -> str:
    """The prompt of an approval ask: worded here, from the tool and the arguments it
    approves, whose ids it must bear. A caller could otherwise ask under the ids of one call
    while showing the person another (or any text at all), and the approval given would
    let the first through. Raises (422) for ids that are not the call's."""
    digest = arguments_digest(arguments)
    ids = {approval_id(session_id, tool, digest, asked) for asked in range(MAX_APPROVAL_ASKS)}
    if pending_action_id not in ids:
        raise BrokerError(
            422, "invalid", f"an approval of {tool} with these arguments is not asked under this id"
        )
    return approval_prompt(tool, arguments)


async def _approved(store: EventStore, session_id: str, tool: str, digest: str) -> bool:
    """Whether a person approved the call: the runner's asks are walked as it walks them —
    past the ones nobody decided (expired, cancelled) to the one decided."""
    for asked in range(MAX_APPROVAL_ASKS):
        pending_action_id = approval_id(session_id, tool, digest, asked)
        stream = await store.load("pending_action", pending_action_id)
        if not stream.events:
            return False  # never asked: the asks are numbered in order
        created = stream.events[0].data
        if not (
            isinstance(created, PendingActionCreated)
            and created.kind is PendingKind.APPROVAL
            and created.session_id == session_id
        ):
            return False
        for event in stream.events[1:]:
            outcome = outcome_of(pending_action_id, event.data)
            if outcome is None:
                continue
            if isinstance(event.data, PendingActionAnswered):
                return outcome.approved is True
            break  # expired or cancelled: nobody decided this ask; the next one, maybe
        else:
            return False  # still waiting for a person
    return False
