"""Tool-broker side of the todo toolpack: `todo.remind`.

The broker runs an operation only if the activation's token names the toolpack and the
manifest lists the operation (its allowlist). The operation gets the broker's support context;
this module relies on the one method it calls, so it imports nothing of the broker.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from suzumio.contracts.commands import CommandAccepted
from suzumio.contracts.errors import InvalidError
from suzumio.contracts.values import Priority
from suzumio_todo.manifest import REMINDER_KIND

MAX_DELAY_SECONDS = 30 * 86_400


class SignalRecorder(Protocol):
    """What `remind` uses of the broker's `SupportContext`."""

    async def record_signal(
        self, kind: str, payload: dict[str, Any], priority: Any, not_before: datetime | None
    ) -> CommandAccepted: ...


class RemindArguments(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=True)

    text: str = Field(default="Look at your todo list.", min_length=1, max_length=500)
    delay_seconds: float = Field(default=0, ge=0, le=MAX_DELAY_SECONDS)


async def remind(ctx: SignalRecorder, arguments: dict[str, Any]) -> dict[str, Any]:
    """Record a routine (P3) `custom` signal of kind `todo.reminder` for the calling
    activation's session, due after `delay_seconds`. A retried call (same request id) records
    nothing twice: the broker derives the signal id from the call."""
    try:
        args = RemindArguments.model_validate(arguments)
    except ValidationError as exc:
        raise InvalidError(f"invalid arguments: {exc.errors(include_url=False)}") from None
    not_before = (
        datetime.now(UTC) + timedelta(seconds=args.delay_seconds) if args.delay_seconds else None
    )
    reply = await ctx.record_signal(REMINDER_KIND, {"text": args.text}, Priority.P3, not_before)
    # Not `not_before`: a retried call answers as the first did, and only that one's clock
    # counted.
    return {"signal_id": reply.result.get("signal_id"), "delay_seconds": args.delay_seconds}
