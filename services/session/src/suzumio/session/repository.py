"""Aggregate states from the event store, cached, with optimistic writes.

A command decides on the cached state and appends conditionally on its version; when another
writer (another replica, another process) got there first, the append fails, the state is
brought up to date and the decision is taken again.
"""

from __future__ import annotations

import asyncio
import random
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from suzumio.contracts.commands import EventRef
from suzumio.contracts.envelope import DomainEvent, EventMeta
from suzumio.contracts.errors import CommandError, UnavailableError
from suzumio.platform.bus.eventstore import (
    AppendResult,
    ConcurrencyConflictError,
    EventStore,
    Head,
)
from suzumio.platform.turns import Turns
from suzumio.session.domain.state import AggregateState

S = TypeVar("S", bound=AggregateState)
RETRY_PAUSE_SECONDS = 0.005  # the first retry's longest pause; doubled at each one after
KEPT_HOWEVER_HEAVY = 2  # the aggregates used last, kept over the cache's bounds (`_keep`)
Decide = Callable[[S], Sequence[DomainEvent]]


@dataclass(frozen=True, slots=True)
class Unchanged:
    """A command that found nothing to do (done already): where the aggregate it decided on
    stands, so its caller waits for the projections to show that, as after a write."""

    seq: int
    events: tuple[EventRef, ...] = ()


Outcome = AppendResult | Unchanged


class Repository:
    def __init__(
        self, store: EventStore, *, cache_size: int = 20_000, cache_weight: int = 1_000_000
    ) -> None:
        """`cache_size`: aggregates kept at most; `cache_weight`: the ids they hold, in all
        (`AggregateState.weight`) — a long session holds one per message, signal and
        checkpoint, and 20,000 of them could hold hundreds of millions."""
        self.store = store
        self._cache: OrderedDict[tuple[str, str], AggregateState] = OrderedDict()
        self._cache_size = cache_size
        self._cache_weight = cache_weight
        self._weights: dict[tuple[str, str], int] = {}
        self._weight = 0
        self._turns: Turns[tuple[str, str]] = Turns()

    async def get(
        self, cls: type[S], aggregate_id: str, *, fresh: bool = True, floor: int = 0
    ) -> S:
        """The aggregate's state; `fresh` checks with the server that nothing came since —
        with `floor`, a server holding the log up to that sequence at least."""
        key = (cls.aggregate, aggregate_id)
        cached = self._cache.get(key)
        state = cached if isinstance(cached, cls) else cls(aggregate_id)
        if cached is not None and not fresh:
            self._cache.move_to_end(key)
            return state
        # What came since, in one round trip: nothing new costs what a head lookup does.
        # Folded as it comes: a long history (a session's thousands of messages, after a
        # restart or an eviction) is never held whole, decoded, in memory.
        async for event in self.store.events(
            cls.aggregate, aggregate_id, after=Head(state.version, state.seq), min_last_seq=floor
        ):
            state.fold(event.data, event.version, event.seq)
        if state.exists:  # a missing aggregate may be created by someone else any moment
            self._keep(key, state)
        return state

    def _keep(self, key: tuple[str, str], state: AggregateState) -> None:
        self._cache[key] = state
        self._cache.move_to_end(key)
        weight = state.weight
        self._weight += weight - self._weights.get(key, 0)
        self._weights[key] = weight
        # The least recently used go first; the two used last stay, however heavy: a command
        # reads its aggregate and then another (a session, then its project for the role),
        # and a session heavier than the whole budget, evicted by its project's read, was read
        # again whole — every message text of it decoded — by every command on it.
        while len(self._cache) > KEPT_HOWEVER_HEAVY and (
            len(self._cache) > self._cache_size or self._weight > self._cache_weight
        ):
            self._forget(next(iter(self._cache)))

    def _forget(self, key: tuple[str, str]) -> None:
        self._cache.pop(key, None)
        self._weight -= self._weights.pop(key, 0)

    async def latest(self, cls: type[S], aggregate_id: str) -> S:
        """The aggregate from a replica holding every acknowledged write: what a refusal
        decided on a plain fresh read (a handler's own check) reads again before it answers."""
        return await self.get(cls, aggregate_id, floor=await self.store.last_position())

    async def _behind(self, cls: type[S], state: S) -> bool:
        """Whether `state`, read fresh, was behind the log: read again from a replica holding
        every acknowledged write. A refusal or a no-op is answered on the state read, with no
        append whose condition would catch a stale one — and with a replicated log, the
        replica answering a read may not have applied a write acknowledged a moment ago (a
        reopen, then a message refused as to a closed session; a close answered as done, the
        session left open)."""
        version = state.version
        return (await self.latest(cls, state.id)).version != version

    async def execute(
        self,
        cls: type[S],
        aggregate_id: str,
        decide: Decide[S],
        meta: EventMeta,
        *,
        attempts: int = 6,
    ) -> tuple[S, Outcome]:
        """Decide on the state and append the result; retried on a concurrent write, after a
        short pause of random length (other writers — the scheduler, other replicas — would
        otherwise meet it again at once). A record that kept changing through every attempt
        is `UnavailableError` (503: send again), never a conflict: a 409 tells a client
        retrying with its idempotency key that its first attempt landed.

        Commands for one aggregate take turns within this process, so they never conflict
        with each other; only another process's write can make an append fail and retry.
        Returns the state after the append and the append's result (`Unchanged`: nothing to
        do).
        """
        async with self._turns.take((cls.aggregate, aggregate_id)):
            return await self._execute(cls, aggregate_id, decide, meta, attempts)

    async def _execute(
        self, cls: type[S], aggregate_id: str, decide: Decide[S], meta: EventMeta, attempts: int
    ) -> tuple[S, Outcome]:
        confirmed = False
        for attempt in range(attempts):
            fresh = attempt > 0
            state = await self.get(cls, aggregate_id, fresh=fresh)
            events, refused = _decided(decide, state)
            if refused is not None or not events:
                if not fresh:
                    continue  # refused, or nothing to do, on a cached state: on the latest
                if confirmed or not await self._behind(cls, state):
                    if refused is not None:
                        raise refused
                    return state, Unchanged(state.seq)
                confirmed = True
                continue
            try:
                result = await self.store.append(aggregate_id, events, state.version, meta)
            except ConcurrencyConflictError:
                if attempt == attempts - 1:
                    raise UnavailableError(
                        f"{cls.aggregate} {aggregate_id} kept changing under this command; "
                        "send it again"
                    ) from None
                await asyncio.sleep(random.uniform(0, RETRY_PAUSE_SECONDS * 2**attempt))
                continue
            if state.version == result.events[0].version - 1:  # nobody folded meanwhile
                for data, ref in zip(events, result.events, strict=True):
                    state.fold(data, ref.version, ref.seq)
                self._keep((cls.aggregate, aggregate_id), state)
            else:
                self._forget((cls.aggregate, aggregate_id))
            return state, result
        # The last attempt read a refusal (or nothing to do) that a replica behind may have
        # decided: not confirmed on the latest, it is no answer — the record kept changing.
        raise UnavailableError(
            f"{cls.aggregate} {aggregate_id} kept changing under this command; send it again"
        )


def _decided(decide: Decide[S], state: S) -> tuple[list[DomainEvent], CommandError | None]:
    try:
        return list(decide(state)), None
    except CommandError as exc:
        return [], exc
