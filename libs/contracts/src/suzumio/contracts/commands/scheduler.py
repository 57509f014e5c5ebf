"""Commands the scheduler answers."""

from __future__ import annotations

from pydantic import Field

from suzumio.contracts.commands.base import Command, command
from suzumio.contracts.ids import Identifier


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
