"""What a projection is: a name, a version, the event types it reads, tables and an apply."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from suzumio.contracts.envelope import DomainEvent, RecordedEvent
from suzumio.platform.db.pool import Connection

Events = Sequence[RecordedEvent[DomainEvent]]


def live_schema(name: str) -> str:
    """The Postgres schema that holds a projection's live tables (`proj_<name>`)."""
    return f"proj_{name}"


class Projection(ABC):
    """A read model built from events.

    `apply` receives, in log order, the events of a batch whose types are in `handles`, inside
    the transaction that also moves the checkpoint; it must be a deterministic function of
    them (take times from the events, never from the clock) so a rebuild reproduces it.
    Tables live in the schema passed in (the live one, or a staging one during a rebuild).
    Bump `version` when the tables or the meaning of the rows change: the projector then
    rebuilds the projection from the log before serving it again.
    """

    name: ClassVar[str]
    version: ClassVar[int]
    handles: ClassVar[frozenset[str]]
    tables: ClassVar[tuple[str, ...]]

    @abstractmethod
    def ddl(self, schema: str) -> str:
        """`CREATE TABLE` (and index) statements for `schema`, which already exists."""

    @abstractmethod
    async def apply(self, conn: Connection, schema: str, events: Events) -> None:
        """Write the effect of `events` into the tables of `schema`."""
