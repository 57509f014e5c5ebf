"""An agent's message counts as the live activation's useful effect only if that activation
wrote it: another agent's message posted into the session (through the tool-broker) is
authored by an agent too, but it is no work of the live one, which may still need its nudge."""

from __future__ import annotations

from suzumio.contracts.events import ActivationCompleted, SessionMessageAppended
from suzumio.contracts.values import Author
from suzumio.scheduler.domain import policy
from tests.unit.test_scheduling_state import opened, signal, start


def agent_message(message_id: str, activation_id: str | None) -> SessionMessageAppended:
    return SessionMessageAppended(
        message_id=message_id,
        author=Author(kind="agent", id="other"),
        role="user",
        text="a message from another agent",
        activation_id=activation_id,
    )


def test_another_agents_message_is_not_the_live_activations_effect() -> None:
    world, log = opened()
    log.append("s", signal("m1"))
    start(log, "x1", "m1")
    log.append("s", agent_message("r1", None))  # posted by another agent: names no activation
    log.append("x1", ActivationCompleted(text=""))
    s = world.sessions["s"]
    assert s.last_ended is not None
    assert not s.last_ended.useful
    assert policy.needs_nudge(s.last_ended)


def test_a_message_of_another_activation_is_not_the_live_ones_effect_either() -> None:
    world, log = opened()
    log.append("s", signal("m1"))
    start(log, "x1", "m1")
    log.append("s", agent_message("r1", "x0"))  # a late entry of an earlier activation
    log.append("x1", ActivationCompleted(text=""))
    s = world.sessions["s"]
    assert s.last_ended is not None
    assert policy.needs_nudge(s.last_ended)
