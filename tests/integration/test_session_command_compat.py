"""Commands that gained a field, sent to a session service of the release before it (a rolling
upgrade, real NATS): `PostMessage` and `RecordSignal` may carry the activation that records
them, and the older service refuses a field it does not know. Left out when unset, every
other sender's commands are taken as before; the tool-broker, which sets it, sends it again
without it when the service refuses it for that."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from nats.aio.client import Client as NATS
from pydantic import create_model

from suzumio.contracts.commands import CommandAccepted, PostMessage, RecordSignal
from suzumio.contracts.commands.base import Command
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.commands import (
    CommandClient,
    CommandContext,
    CommandRouter,
    CommandServer,
)
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.tokens import ActivationClaims
from suzumio.toolbroker.support import SupportContext


def older(command: type[Command]) -> type[Command]:
    """`command` as the release before had it: no `activation_id`, unknown fields refused."""
    fields: dict[str, Any] = {
        name: (info.annotation, info)
        for name, info in command.model_fields.items()
        if name != "activation_id"
    }
    made: type[Command] = create_model(f"Older{command.__name__}", __base__=Command, **fields)
    made.service, made.verb = command.service, command.verb
    return made


async def test_an_older_session_service_takes_the_commands_of_this_release(
    nc: NATS, topology: Topology, commands: CommandClient, store: EventStore
) -> None:
    taken: list[Command] = []

    async def take(ctx: CommandContext[Command]) -> CommandAccepted:
        taken.append(ctx.command)
        return CommandAccepted()

    router = CommandRouter("session")
    for command in (PostMessage, RecordSignal):
        router.register(older(command), take)
    server = CommandServer(nc, topology, router)
    await server.start()
    try:
        session_id = new_id()
        # As the gateway and the scheduler send them: no activation.
        await commands.send(
            PostMessage(session_id=session_id, message_id=new_id(), signal_id=new_id(), text="hi"),
            actor="user:u",
        )
        await commands.send(
            RecordSignal(session_id=session_id, signal_id=new_id()), actor="system:scheduler"
        )
        # As the tool-broker sends an agent's own: with its activation, refused, then without.
        claims = ActivationClaims(
            activation_id=new_id(),
            session_id=session_id,
            project_id=new_id(),
            agent_id=new_id(),
            expires_at=datetime.now(UTC) + timedelta(minutes=5),
        )
        ctx = SupportContext(claims, "core", "signal.record", "r1", commands, store)
        answered = await ctx.record_signal("reminder", {}, "P3", None)
    finally:
        await server.drain(2)
    assert isinstance(answered, CommandAccepted)
    assert [type(c).__name__ for c in taken] == [
        "OlderPostMessage",
        "OlderRecordSignal",
        "OlderRecordSignal",
    ]
    sent = taken[2].model_dump()
    assert (sent["signal_id"], sent["payload"]["kind"]) == (ctx.derived("signal"), "reminder")
