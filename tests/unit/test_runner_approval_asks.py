"""A tool call under the `ask` policy whose first approval nobody decided (it expired, or was
cancelled with its activation): the approval a person gives to the ask after it must be found
by every later try of the same call. With the activation in that ask's id, each activation
asked anew, and the call never ran.

The broker is an `httpx.MockTransport` holding the pending actions' states, as the broker
answers an ask with an id it has seen: with that action's state, at once."""

from __future__ import annotations

import json

import httpx

from suzumio.runner.broker import BrokerClient
from suzumio.runner.tools.core import CoreTools
from tests.unit.loop_support import TOKEN

SESSION = "s" * 26


class Approvals:
    """Pending actions by id: a new one is `pending` (nobody decided within the wait)."""

    def __init__(self) -> None:
        self.states: dict[str, dict[str, object]] = {}
        self.asked: list[str] = []

    def answer(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        action = body["pending_action_id"]
        self.asked.append(action)
        state = self.states.setdefault(action, {"status": "pending"})
        return httpx.Response(200, json={"pending_action_id": action, **state})


async def approve(approvals: Approvals, activation: str) -> str:
    http = httpx.AsyncClient(
        base_url="http://broker", transport=httpx.MockTransport(approvals.answer)
    )
    core = CoreTools(BrokerClient("http://broker", TOKEN, http=http), activation, SESSION, 0)
    try:
        outcome = await core.approval("shell.exec", '{"command": "deploy"}', "d" * 64, 0)
    finally:
        await http.aclose()
    return outcome.result.status if outcome.waiting_for is None else "waiting"


async def test_an_approval_given_after_one_expired_is_found_by_later_activations() -> None:
    approvals = Approvals()
    assert await approve(approvals, "a" * 26) == "waiting"  # asked; nobody decides in time
    [first] = approvals.asked
    approvals.states[first] = {"status": "expired"}
    assert await approve(approvals, "b" * 26) == "waiting"  # asked again
    second = approvals.asked[-1]
    assert second != first
    approvals.states[second] = {"status": "answered", "approved": True}  # a person approves
    assert await approve(approvals, "c" * 26) == "ok"  # a later activation finds it
    assert approvals.asked[-2:] == [first, second]
    assert await approve(approvals, "d" * 26) == "ok"  # and so does every one after
