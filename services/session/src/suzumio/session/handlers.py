"""The command table of the session service: every `cmd.session.<verb>` it answers."""

from __future__ import annotations

from suzumio.platform.bus.commands import CommandRouter
from suzumio.platform.bus.eventstore import EventStore


def build_router(store: EventStore) -> CommandRouter:  # noqa: ARG001 - handlers come with the API
    return CommandRouter("session")
