"""The `cancel_activation` command as built: what it refuses before anything is sent."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from suzumio.contracts.commands import COMMAND_TYPES, CancelActivation
from suzumio.contracts.commands.base import CommandRequest
from suzumio.platform.bus.commands import CommandRouter
from suzumio.scheduler.handlers import build_router


def test_it_is_the_schedulers_command() -> None:
    assert COMMAND_TYPES[("scheduler", "cancel_activation")] is CancelActivation
    router = build_router(None)  # type: ignore[arg-type]  # registration only
    assert isinstance(router, CommandRouter)
    assert "cancel_activation" in router.verbs


@pytest.mark.parametrize(
    "data",
    [
        {"activation_id": "a1"},  # no project
        {"project_id": "p1"},  # no activation
        {"activation_id": "../x", "project_id": "p1"},  # not an id
        {"activation_id": "a1", "project_id": "p1", "reason": "x" * 501},
        {"activation_id": "a1", "project_id": "p1", "reason": "nul\x00"},
        {"activation_id": "a1", "project_id": "p1", "force": True},  # a typo is an error
    ],
)
def test_malformed_cancels_are_refused(data: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        CancelActivation.model_validate(data)


@pytest.mark.parametrize(
    "data",
    [
        {"activation_id": "a1"},
        {"activation_id": "a1", "project_id": "p1", "reason": "\x00"},
    ],
)
async def test_the_router_answers_invalid_without_calling_the_scheduler(
    data: dict[str, object],
) -> None:
    router = build_router(None)  # type: ignore[arg-type]  # a call would fail: none is made
    request = CommandRequest(
        service="scheduler", verb="cancel_activation", actor="user:u1", data=data
    )
    reply = await router.dispatch(request)
    assert reply.status == "error"
    assert reply.error.code == "invalid"


def test_a_well_formed_cancel() -> None:
    cmd = CancelActivation(activation_id="a1", project_id="p1", reason="wrong prompt")
    assert (cmd.service, cmd.verb) == ("scheduler", "cancel_activation")
    assert CancelActivation(activation_id="a1", project_id="p1").reason == ""
