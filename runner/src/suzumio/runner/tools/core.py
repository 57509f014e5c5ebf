"""The `core` toolpack's model-facing tools: the stateful ones, which go through the broker.

`message.send` and `signal.record` are the broker's support operations; `ask_user` is a
pending action; `checkpoint` stores the session checkpoint; `activation.complete` ends the
activation with a result. Ids of what a call creates derive from the activation and the call,
so a retried call creates nothing twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from suzumio.contracts.broker import AskRequest, CheckpointPut, SupportCall
from suzumio.contracts.ids import derived_id
from suzumio.contracts.policies import MAX_APPROVAL_ASKS, approval_id, approval_prompt
from suzumio.contracts.runner import ToolDefinition
from suzumio.contracts.values import PendingKind
from suzumio.runner.broker import BrokerClient, BrokerError
from suzumio.runner.tools.base import ToolResult

CORE_TOOLS: dict[str, ToolDefinition] = {
    "message.send": ToolDefinition(
        name="message.send",
        description="Send a message to another session (another agent) of this project. "
        "It wakes that session's agent.",
        parameters={
            "type": "object",
            "properties": {
                "session_id": {"type": "string", "description": "the target session"},
                "text": {"type": "string"},
                "priority": {"type": "string", "enum": ["P1", "P2", "P3"]},
            },
            "required": ["session_id", "text"],
            "additionalProperties": False,
        },
    ),
    "signal.record": ToolDefinition(
        name="signal.record",
        description="Record pending work for yourself in this session, now or after a delay "
        "(a reminder). You will be woken with it.",
        parameters={
            "type": "object",
            "properties": {
                "kind": {"type": "string", "description": "a short label, e.g. reminder"},
                "payload": {"type": "object"},
                "delay_seconds": {"type": "number", "minimum": 0},
            },
            "required": ["kind"],
            "additionalProperties": False,
        },
    ),
    "ask_user": ToolDefinition(
        name="ask_user",
        description="Ask the user a question and get the answer. If nobody answers soon, "
        "this activation ends and you are woken again with the answer.",
        parameters={
            "type": "object",
            "properties": {
                "question": {"type": "string"},
                "options": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["question"],
            "additionalProperties": False,
        },
    ),
    "checkpoint": ToolDefinition(
        name="checkpoint",
        description="Save notes about your progress (a JSON object) for the next activation "
        "of this session. The latest checkpoint is given to you when you start.",
        parameters={
            "type": "object",
            "properties": {"data": {"type": "object"}},
            "required": ["data"],
            "additionalProperties": False,
        },
    ),
    "activation.complete": ToolDefinition(
        name="activation.complete",
        description="Finish this piece of work with a final result for the user.",
        parameters={
            "type": "object",
            "properties": {"result": {"type": "string"}},
            "required": ["result"],
            "additionalProperties": False,
        },
    ),
}
EXCLUSIVE = frozenset({"ask_user", "activation.complete", "checkpoint"})


@dataclass
class CoreOutcome:
    result: ToolResult
    complete: str | None = None  # activation.complete's result
    waiting_for: str | None = None  # a pending action nobody answered yet


class CoreTools:
    def __init__(
        self, broker: BrokerClient, activation_id: str, session_id: str, ask_wait: float
    ) -> None:
        self._broker = broker
        self._activation_id = activation_id
        self._session_id = session_id
        self.ask_wait = ask_wait
        self.answered: set[str] = set()  # pending actions answered while this activation ran

    async def run(
        self, name: str, args: dict[str, Any], call_id: str, approved: str | None = None
    ) -> CoreOutcome:
        try:
            return await self._run(name, args, call_id, approved)
        except BrokerError as exc:
            if exc.status in {401, 403}:
                raise
            return CoreOutcome(ToolResult(f"refused: {exc.detail}", "error"))

    async def _run(
        self, name: str, args: dict[str, Any], call_id: str, approved: str | None
    ) -> CoreOutcome:
        match name:
            case "message.send" | "signal.record":
                call = SupportCall(
                    operation=name, arguments=args, request_id=call_id, approved_call=approved
                )
                reply = await self._broker.support("core", call)
                return CoreOutcome(ToolResult(json.dumps(reply.result)))
            case "ask_user":
                return await self._ask(args, call_id, approved)
            case "checkpoint":
                return await self._checkpoint(args, call_id, approved)
            case "activation.complete":
                return CoreOutcome(ToolResult("completed"), complete=str(args.get("result", "")))
        return CoreOutcome(ToolResult(f"unknown core tool {name}", "error"))

    async def _checkpoint(
        self, args: dict[str, Any], call_id: str, approved: str | None
    ) -> CoreOutcome:
        data = args.get("data")
        if not isinstance(data, dict):
            return CoreOutcome(ToolResult("`data` must be an object", "error"))
        checkpoint_id = derived_id("checkpoint", self._activation_id, call_id)
        await self._broker.put_checkpoint(
            CheckpointPut(checkpoint_id=checkpoint_id, data=data, approved_call=approved)
        )
        return CoreOutcome(ToolResult("checkpoint saved"))

    async def _ask(self, args: dict[str, Any], call_id: str, approved: str | None) -> CoreOutcome:
        question = str(args.get("question", "")).strip()
        if not question:
            return CoreOutcome(ToolResult("`question` is required", "error"))
        options = tuple(str(o) for o in args.get("options") or ())
        pending_id = derived_id("ask", self._activation_id, call_id)
        outcome = await self._broker.ask(
            AskRequest(
                pending_action_id=pending_id,
                prompt=question,
                options=options,
                wait_seconds=self.ask_wait,
                approved_call=approved,
            )
        )
        # The broker names the question's pending action (derived from the session and this
        # id): its answer's signal, and the person's list, bear that id.
        asked = outcome.pending_action_id
        if outcome.status == "answered":
            self.answered.add(asked)
        return settle(outcome.status, outcome.answer, asked, "the user's answer")

    async def approval(self, tool: str, arguments: str, digest: str, wait: float) -> CoreOutcome:
        """Ask a person to approve a tool call (policy `ask`). The ids derive from the session,
        the tool and its arguments, and a count: the same call asked again (in a later
        activation, after the answer) walks the ones nobody decided (expired, or cancelled
        with their activation) to the one decided, or asks under the next. With the
        activation in the id, an approval given to a later ask was never found again: each
        activation asked anew, and the call never ran."""
        prompt = approval_prompt(tool, arguments)
        for asked in range(MAX_APPROVAL_ASKS):
            pending_id = approval_id(self._session_id, tool, digest, asked)
            outcome = await self._broker.ask(
                AskRequest(
                    pending_action_id=pending_id,
                    kind=PendingKind.APPROVAL,
                    prompt=prompt,
                    wait_seconds=wait,
                    tool=tool,
                    approved_call=arguments,
                )
            )
            if outcome.status not in {"expired", "cancelled"}:  # else nobody decided: again
                break
        if outcome.status == "answered":
            self.answered.add(pending_id)
            if outcome.approved:
                return CoreOutcome(ToolResult("approved"))
            return CoreOutcome(ToolResult(f"{tool} was not approved by the user", "denied"))
        return settle(outcome.status, "", pending_id, "the approval")


def settle(status: str, answer: str, pending_id: str, what: str) -> CoreOutcome:
    match status:
        case "answered":
            return CoreOutcome(ToolResult(answer or "(empty answer)"))
        case "pending":
            return CoreOutcome(
                ToolResult(
                    f"Waiting for {what} (pending action {pending_id}). This activation ends "
                    "now; you will be woken with it."
                ),
                waiting_for=pending_id,
            )
        case _:
            return CoreOutcome(ToolResult(f"no answer: the question was {status}", "error"))
