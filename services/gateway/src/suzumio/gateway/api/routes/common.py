"""Sending a command for a route, and waiting until its effect can be read back."""

from __future__ import annotations

from fastapi import Response
from nats.errors import MaxPayloadError

from suzumio.contracts.commands import Command, CommandAccepted
from suzumio.gateway.api.auth import Principal
from suzumio.gateway.api.deps import POSITION_HEADER, written
from suzumio.gateway.api.problems import ERROR_RESPONSES, ApiError
from suzumio.gateway.state import Gateway

RESPONSES = ERROR_RESPONSES


async def send(
    gw: Gateway, who: Principal, command: Command, response: Response
) -> CommandAccepted:
    try:
        reply = await gw.commands.send(
            command, actor=who.actor, timeout=gw.settings.command_timeout
        )
    except MaxPayloadError:
        # Nothing was published: the request is too large for the bus, not a server fault.
        raise ApiError(
            413, "the request is too large to pass on; send less (smaller fields)"
        ) from None
    written(response, reply.position)
    return reply


async def settle(gw: Gateway, reply: CommandAccepted, *, location: str | None = None) -> None:
    """Wait until the read models show the command's effect, so what a write returns is what
    a read returns. `location`: what the command created, said in a 504 too."""
    await settled(gw, reply.position, location=location)


async def settled(gw: Gateway, position: int, *, location: str | None = None) -> None:
    """Wait until the read models reached `position` (the last of a route's writes)."""
    if position and not await gw.positions.wait_for(position, gw.settings.read_your_writes_timeout):
        # The write is in the log: the answer still says where (a problem response carries
        # none of the route's headers), so the client can read it back with `min_position`
        # — and what was created, whose id it would not learn otherwise.
        headers = {POSITION_HEADER: str(position)}
        if location is not None:
            headers["Location"] = location
        raise ApiError(
            504,
            "the change was made but the read models have not caught up yet",
            headers=headers,
        )
