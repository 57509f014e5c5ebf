"""Sending a command for a route, and waiting until its effect can be read back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from fastapi import Response
from nats.errors import MaxPayloadError

from suzumio.contracts.commands import Command, CommandAccepted
from suzumio.contracts.errors import ConflictError, is_id_taken
from suzumio.gateway.api.auth import Principal
from suzumio.gateway.api.deps import FIRST_READ_WAIT, POSITION_HEADER, written
from suzumio.gateway.api.problems import ERROR_RESPONSES, RETRY_AFTER_SECONDS, ApiError
from suzumio.gateway.state import Gateway
from suzumio.platform.bus.jsapi import stream_last_seq

RESPONSES = ERROR_RESPONSES
# The read models a route answers from after its write (the projections' names).
ReadModel = Literal[
    "activations",
    "agents",
    "artifacts",
    "pending_actions",
    "projects",
    "sessions",
    "signals",
    "users",
]


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


async def settle(
    gw: Gateway, reply: CommandAccepted, *, reads: ReadModel | None, location: str | None = None
) -> None:
    """Wait until the read models show the command's effect, so what a write returns is what
    a read returns. `reads`: the read model the route answers from; `location`: what the
    command created, said in a 504 too."""
    await settled(gw, reply.position, reads=reads, location=location)


async def settled(
    gw: Gateway, position: int, *, reads: ReadModel | None, location: str | None = None
) -> None:
    """Wait until the read models reached `position` (the last of a route's writes), and
    make sure `reads`, the read model the route answers from, is serving.

    Raises:
        ApiError: 504, the change made but not to be read back yet: the read models are
            behind, or `reads` is frozen (rebuilt for a new version, or left to a later
            release mid-upgrade: the waits leave it out, and its tables lack the change).
            Read back from a frozen model, a create answered 404 or 500 and an update its
            old state, for a write that was made.
    """
    if position and not await gw.positions.wait_for(position, gw.settings.read_your_writes_timeout):
        raise _made_not_shown(
            "the change was made but the read models have not caught up yet", position, location
        )
    if reads is not None:
        await gw.positions.first_read(FIRST_READ_WAIT)
        if not gw.positions.serving(reads):
            raise _made_not_shown(
                f"the change was made but the {reads} read model is being rebuilt (or is kept"
                " by another release mid-upgrade): read it back once it serves again",
                position,
                location,
            )


def _made_not_shown(detail: str, position: int, location: str | None) -> ApiError:
    # The write is in the log: the answer still says where (a problem response carries none
    # of the route's headers), so the client can read it back with `min_position` — and what
    # was created, whose id it would not learn otherwise. A 504 is kept for an
    # Idempotency-Key: a retry must not make the change again.
    headers = {POSITION_HEADER: str(position)}
    if location is not None:
        headers["Location"] = location
    return ApiError(504, detail, headers=headers)


async def made_before(gw: Gateway, reads: ReadModel, sql: str, *args: object) -> Any:
    """For a keyed request refused as existing — a retry of one whose answer was lost (a
    command timed out, the gateway died before keeping it): the row `sql` finds in the read
    model `reads` once that model reached the log's end (None: there is none). The caller
    answers as the first attempt would have when the row is what this request makes.

    Raises:
        ApiError: 503 to retry (not kept for the key) when the read model cannot show it yet.
    """
    end = await stream_last_seq(gw.nc, gw.topology.events_stream)
    if not await gw.positions.wait_for(end, gw.settings.read_your_writes_timeout, projection=reads):
        raise ApiError(
            503,
            "what an earlier attempt of this request made cannot be read back yet; retry",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    return await gw.pool.fetchrow(sql, *args)


async def earlier_attempt(
    gw: Gateway,
    refused: ConflictError,
    keyed: bool,
    reads: ReadModel,
    sql: str,
    *args: object,
    same: Callable[[Any], bool],
) -> Any:
    """The row of what an earlier attempt of a keyed request made (`made_before`), when a
    retry is `refused` as existing under the ids derived from the key and the row is `same`
    as this request would make; else `refused` stands.

    Before, such a retry — its first attempt's answer lost to a command that timed out —
    answered 409, and the client took its request for failed and sent it again under a
    new key: a second project, a message posted twice."""
    # Only a refusal of the ids as taken: "the session is closed", "the agent is disabled"
    # are refusals of the request, whoever asks.
    if not keyed or not is_id_taken(refused):
        raise refused
    try:
        row = await made_before(gw, reads, sql, *args)
    except ApiError:  # the read model cannot say yet: the refusal stands
        raise refused from None
    if row is None or not same(row):
        raise refused
    return row
