"""What every aggregate state has: an id, a version, and a fold over its events."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from suzumio.contracts.envelope import DomainEvent


class AggregateState(ABC):
    """The state of one aggregate instance, as of `version` (0 = no events yet)."""

    aggregate: ClassVar[str]

    def __init__(self, aggregate_id: str) -> None:
        self.id = aggregate_id
        self.version = 0
        self.seq = 0  # stream sequence of the last event folded in

    @property
    def exists(self) -> bool:
        return self.version > 0

    @property
    def weight(self) -> int:
        """What it holds, in ids (a cache bounds the sum): 1 unless it keeps ids by the event."""
        return 1

    def fold(self, data: DomainEvent, version: int, seq: int) -> None:
        if version <= self.version:  # seen already (two readers brought the state up to date)
            return
        self.apply(data)
        self.version = version
        self.seq = seq

    @abstractmethod
    def apply(self, data: DomainEvent) -> None:
        """Change the state by one event of this aggregate."""
