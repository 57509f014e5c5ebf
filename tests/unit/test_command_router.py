"""Routing of commands to handlers and the typed error replies (no I/O)."""

from __future__ import annotations

import nats.errors
import pytest

from suzumio.contracts.commands import (
    CommandAccepted,
    CommandRejected,
    CommandRequest,
    CreateProject,
    OpenSession,
)
from suzumio.contracts.errors import CommandError, ErrorCode, ForbiddenError
from suzumio.platform.bus.commands import CommandContext, CommandRouter
from suzumio.platform.errors import JetStreamApiError


def request(verb: str, data: dict[str, object], service: str = "session") -> CommandRequest:
    return CommandRequest(service=service, verb=verb, actor="user:u", data=data)


async def accept(ctx: CommandContext[CreateProject]) -> CommandAccepted:
    return CommandAccepted(result={"name": ctx.command.name})


async def test_dispatch_validates_and_calls_the_handler() -> None:
    router = CommandRouter("session")
    router.register(CreateProject, accept)
    reply = await router.dispatch(
        request("create_project", {"project_id": "p1", "name": "  spaced  "})
    )
    assert isinstance(reply, CommandAccepted)
    assert reply.result == {"name": "spaced"}


@pytest.mark.parametrize(
    ("data", "loc"),
    [
        ({"project_id": "p"}, "name"),
        ({"project_id": "p", "name": ""}, "name"),
        ({"project_id": "p", "name": "x", "typo": 1}, "typo"),
    ],
)
async def test_invalid_payloads_are_refused_with_locations(
    data: dict[str, object], loc: str
) -> None:
    router = CommandRouter("session")
    router.register(CreateProject, accept)
    reply = await router.dispatch(request("create_project", data))
    assert isinstance(reply, CommandRejected)
    assert reply.error.code == ErrorCode.INVALID
    assert reply.error.details["errors"][0]["loc"] == loc


async def test_errors_keep_their_code_and_details() -> None:
    async def refuse(_: CommandContext[CreateProject]) -> CommandAccepted:
        raise ForbiddenError("not a member", project_id="p1")

    router = CommandRouter("session")
    router.register(CreateProject, refuse)
    reply = await router.dispatch(request("create_project", {"project_id": "p1", "name": "x"}))
    assert isinstance(reply, CommandRejected)
    error = CommandError.from_body(reply.error)
    assert isinstance(error, ForbiddenError)
    assert error.details == {"project_id": "p1"}


async def test_a_router_only_takes_its_own_services_commands() -> None:
    router = CommandRouter("scheduler")
    with pytest.raises(ValueError, match="belongs to session"):
        router.register(OpenSession, accept)  # type: ignore[arg-type]
    router = CommandRouter("session")
    router.register(CreateProject, accept)
    with pytest.raises(ValueError, match="has a handler"):
        router.register(CreateProject, accept)
    reply = await router.dispatch(
        request("create_project", {"project_id": "p1", "name": "x"}, service="gateway")
    )
    assert isinstance(reply, CommandRejected)


async def answer_to_a_handler_raising(exc: Exception) -> CommandRejected:
    async def raising(_: CommandContext[CreateProject]) -> CommandAccepted:
        raise exc

    router = CommandRouter("session")
    router.register(CreateProject, raising)
    reply = await router.dispatch(request("create_project", {"project_id": "p1", "name": "x"}))
    assert isinstance(reply, CommandRejected)
    return reply


@pytest.mark.parametrize(
    "trouble",
    [
        JetStreamApiError(503, 10008, "JetStream system temporarily unavailable"),
        nats.errors.NoRespondersError(),
        nats.errors.ConnectionClosedError(),
        TimeoutError(),
    ],
    ids=["leader_election", "no_responders", "connection_closed", "timeout"],
)
async def test_nats_in_trouble_under_a_handler_is_unavailable_not_internal(
    trouble: Exception,
) -> None:
    """A stream electing its leader refused the handler's append (nothing stored), say: the
    caller is told to try again (`unavailable`, a 503 the API's Idempotency-Key slot does not
    keep), not that the command failed for good (`internal`, a 500 kept and replayed to
    every retry with that key for a day)."""

    assert (await answer_to_a_handler_raising(trouble)).error.code == ErrorCode.UNAVAILABLE


@pytest.mark.parametrize(
    "failure",
    [JetStreamApiError(400, 10052, "bad request"), ValueError("a bug of ours")],
    ids=["refused_request", "bug"],
)
async def test_a_handlers_own_failure_stays_internal(failure: Exception) -> None:
    assert (await answer_to_a_handler_raising(failure)).error.code == ErrorCode.INTERNAL
