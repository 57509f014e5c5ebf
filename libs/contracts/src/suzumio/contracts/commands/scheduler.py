"""Commands the scheduler answers."""

from __future__ import annotations

from pydantic import Field

from suzumio.contracts.commands.base import Command, command
from suzumio.contracts.ids import Identifier
from suzumio.contracts.values import Clean


@command("scheduler", "take_signals")
class TakeSignals(Command):
    """Sent by the tool-broker at a tool boundary of a live activation: the P1 signals to put
    into its history now (DESIGN.md §6). The reply's `signals` are `SignalSpec`s.

    Safe to repeat: signals handed to this activation before and not listed in `received`
    are handed over again, so a lost reply loses nothing.
    """

    session_id: Identifier
    activation_id: Identifier
    received: tuple[Identifier, ...] = Field(default=(), max_length=10_000)


@command("scheduler", "cancel_activation")
class CancelActivation(Command):
    """Stop a live activation now (DESIGN.md §2, §7): the scheduler — the one writer of
    `session.activation_cancel_requested`, which it already appends for a P0 — appends it on
    the activation's session, conditional on the session's version. The orchestrator then
    kills the sandbox and ends it `activation.cancelled`; the tool-broker and the session
    service fence its token at once.

    `project_id` is the project the caller found the activation in: an activation of
    another project is `not_found`, like a missing one. Replies: accepted with
    `result.outcome` = `requested` (the cancel was appended; `position` says where) or
    `already_requested` (a cancel is on its way already: nothing appended); refused with
    `conflict` when the activation has already ended (`details.status`: completed, failed,
    cancelled, timed_out), `not_found` when there is no such activation.
    """

    activation_id: Identifier
    project_id: Identifier
    reason: Clean = Field(default="", max_length=500)
