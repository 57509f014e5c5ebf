"""A person who cancels an activation stops its work (docs/api.md): its question, left open,
must not wake the agent when it expires an hour later — it is cancelled then instead. A P0's
replacement is no such stop: the replaced activation's question expires and wakes the agent as
before. And a question created for an activation a cancel fenced meanwhile is cancelled at once
(the domain rule; the race itself cannot be timed from outside)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.events import (
    ActivationCancelRequested,
    ActivationRequested,
    PendingActionCancelled,
    PendingActionCreated,
    SessionOpened,
)
from suzumio.contracts.values import PendingKind
from suzumio.session.domain import pending_action
from suzumio.session.domain.pending_action import PendingActionState
from suzumio.session.domain.session import SessionState
from tests.e2e.api import new_world, ok
from tests.e2e.runner_env import request_activation
from tests.e2e.stack import Stack
from tests.e2e.test_api_pending_stream import ask
from tests.support import eventually


@pytest.mark.parametrize(
    ("closes_work", "status"), [(True, "cancelled"), (False, "expired")], ids=["user", "p0"]
)
async def test_a_question_of_an_activation_cancelled_with_its_work_wakes_no_one(
    stack: Stack, closes_work: bool, status: str
) -> None:
    world = await new_world(stack, f"cw{status[:3]}")
    activation_id = await request_activation(stack, world)
    action_id = await ask(
        stack, world, PendingKind.QUESTION, timeout=1, activation_id=activation_id
    )
    cancel = ActivationCancelRequested(
        activation_id=activation_id, reason="cancelled by user:x", closes_work=closes_work
    )
    await stack.store.append_next(world.session_id, [cancel], EventMeta(actor="system:scheduler"))
    async with stack.client(world.key) as c:
        ended = await eventually(
            lambda: c.get(f"/v1/pending-actions/{action_id}"),
            lambda r: r.status_code == 200 and r.json()["status"] != "open",
            timeout=15,
            what="the question's end",
        )
        assert ended.json()["status"] == status
        if closes_work:
            # Its end is in the log before the signal would be: none came after it either.
            stream = await stack.store.load("pending_action", action_id)
            assert isinstance(stream.events[-1].data, PendingActionCancelled)
            signals = ok(await c.get(f"/v1/sessions/{world.session_id}/signals"))["items"]
            assert [s for s in signals if "pending_action_id" in s["payload"]] == []
        else:
            await eventually(
                lambda: c.get(f"/v1/sessions/{world.session_id}/signals"),
                lambda r: any(
                    s["payload"].get("pending_action_id") == action_id for s in r.json()["items"]
                ),
                what="the wake-up signal",
            )


def test_a_question_created_past_a_cancel_is_cancelled_at_once() -> None:
    session = SessionState("s")
    session.apply(SessionOpened(project_id="p", agent_id="g"))
    session.apply(ActivationRequested(activation_id="a1", agent_id="g", signal_ids=()))
    state = PendingActionState("q")
    later = datetime.now(UTC) + timedelta(hours=1)
    state.apply(
        PendingActionCreated(
            project_id="p", session_id="s", agent_id="g", activation_id="a1",
            kind=PendingKind.QUESTION, prompt="?", expires_at=later,
        )
    )  # fmt: skip
    assert pending_action.cancel_if_fenced(state, session) == []  # still live: kept
    session.apply(ActivationCancelRequested(activation_id="a1"))  # stored after the create's read
    [cancelled] = pending_action.cancel_if_fenced(state, session)
    assert isinstance(cancelled, PendingActionCancelled)
    assert "cancelled" in cancelled.reason
