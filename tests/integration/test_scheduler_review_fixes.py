"""Fixes from a review of the scheduler, end to end on real NATS and Postgres: two P0s in a row,
enabling an agent, an activation that ends during the previous one's review, a nudge refused
while the session service is away, and an append conflict while the fold lags."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import pytest
from nats.aio.client import Client as NATS

from suzumio.contracts.commands import Command, CommandAccepted
from suzumio.contracts.envelope import DomainEvent, EventMeta
from suzumio.contracts.errors import ConflictError, UnavailableError
from suzumio.contracts.events import (
    ActivationRequested,
    AgentCreated,
    AgentDisabled,
    AgentEnabled,
    CheckpointSaved,
    SessionOpened,
    SignalRecorded,
    SignalsDelivered,
)
from suzumio.contracts.ids import new_id
from suzumio.contracts.scheduling import AgentSchedulingState, HookAction
from suzumio.contracts.subjects import Topology
from suzumio.contracts.values import ActivationReason, ModelSpec, Priority, SignalKind
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.eventstore import AppendResult, EventStore
from suzumio.platform.bus.follower import LogMessage
from suzumio.scheduler.hooks import Hooks, NamedHook
from tests.integration.test_scheduler import Gate, requests, running, session_service
from tests.scheduling import Outcome, Sessions, StandInLauncher
from tests.support import eventually


async def nudges(world: Sessions, session_id: str) -> list[SignalRecorded]:
    found = await world.events(session_id, SignalRecorded)
    return [s for s in found if s.kind is SignalKind.NUDGE]


async def agent_and_session(store: EventStore, world: Sessions) -> tuple[str, str]:
    """An agent of a new project, and a session of it: their ids."""
    project = await world.project()
    agent_id, session = new_id(), new_id()
    agent = AgentCreated(
        project_id=project, name="a", role="r", prompt="", model=ModelSpec(name="m")
    )
    await store.append(agent_id, [agent], 0)
    await store.append(session, [SessionOpened(project_id=project, agent_id=agent_id)], 0)
    return agent_id, session


async def test_two_p0_signals_in_a_row_do_not_preempt_each_other_and_both_are_delivered(
    nc: NATS, topology: Topology, store: EventStore, database_url: str
) -> None:
    world = Sessions(store)
    session = await world.session(await world.project())
    gate = Gate()
    async with (
        StandInLauncher(nc, topology, store, gate) as launcher,
        running(nc, topology, store, database_url) as scheduler,
    ):
        stop1 = await world.signal(session, Priority.P0)
        [a1] = await requests(launcher, 1)
        stop2 = await world.signal(session, Priority.P0)
        a2 = (await requests(launcher, 2))[1]
        assert (a2.signal_ids, a2.replaces) == ((stop2,), a1.activation_id)
        # a1 ends cancelled and its P0 queues again...
        await eventually(
            lambda: asyncio.sleep(0, scheduler.world.sessions[session].pending),
            lambda pending: stop1 in pending,
            what="the replaced activation's P0 queued again",
        )
        await asyncio.sleep(1.0)  # (time for a wrong preemption to show; none must)
        # ... without preempting a2 (it did, and so on, thousands of times a second).
        assert len(launcher.requested) == 2
        assert launcher.cancel_requests == [a1.activation_id]
        # It is not lost: it starts the next activation once a2 is done.
        gate.end(a2.activation_id)
        [_, _, a3] = await requests(launcher, 3)
        assert (a3.signal_ids, a3.replaces) == ((stop1,), None)
        gate.end(a3.activation_id)
        await asyncio.sleep(0.5)
        assert len(launcher.requested) == 3


async def test_enabling_an_agent_starts_its_sessions_waiting_signal(
    nc: NATS, topology: Topology, store: EventStore, database_url: str
) -> None:
    world = Sessions(store)
    agent_id, session = await agent_and_session(store, world)
    await store.append(agent_id, [AgentDisabled()], 1)
    async with (
        StandInLauncher(nc, topology, store, Gate()) as launcher,
        running(nc, topology, store, database_url) as scheduler,
    ):
        signal_id = await world.signal(session, Priority.P1)
        await eventually(
            lambda: asyncio.sleep(0, scheduler.world.sessions[session].pending),
            lambda pending: signal_id in pending,
            what="the signal folded",
        )
        await asyncio.sleep(0.3)
        assert launcher.requested == []  # the agent is disabled
        await store.append(agent_id, [AgentEnabled()], 2)
        [a1] = await requests(launcher, 1)
        assert a1.signal_ids == (signal_id,)


async def test_a_p0_to_a_disabled_agent_stops_its_live_activation_and_waits(
    nc: NATS, topology: Topology, store: EventStore, database_url: str
) -> None:
    """A P0 is "stop now": the agent disabled while its activation runs, a user's stop went
    nowhere until someone enabled the agent again."""
    world = Sessions(store)
    agent_id, session = await agent_and_session(store, world)
    async with (
        StandInLauncher(nc, topology, store, Gate()) as launcher,
        running(nc, topology, store, database_url),
    ):
        await world.signal(session, Priority.P1)
        [a1] = await requests(launcher, 1)
        await store.append(agent_id, [AgentDisabled()], 1)
        stop = await world.signal(session, Priority.P0)
        await eventually(
            lambda: asyncio.sleep(0, launcher.cancel_requests),
            lambda cancelled: cancelled == [a1.activation_id],
            what="the live activation stopped",
        )
        await asyncio.sleep(0.5)
        assert len(launcher.requested) == 1  # nothing starts: the agent is disabled
        await store.append(agent_id, [AgentEnabled()], 2)
        [_, a2] = await requests(launcher, 2)
        assert a2.signal_ids[0] == stop  # the P0 first


async def test_an_activation_that_ends_during_the_previous_review_is_reviewed_too(
    nc: NATS, topology: Topology, store: EventStore, database_url: str
) -> None:
    world = Sessions(store)
    session = await world.session(await world.project())
    release = asyncio.Event()
    seen: list[str] = []

    async def slow_first(state: AgentSchedulingState) -> Sequence[HookAction]:
        assert state.last_activation is not None
        seen.append(state.last_activation.id)
        if len(seen) == 1:
            await release.wait()  # the first review runs until the second activation ended
        return []

    count = 0

    async def useful_then_idle(_: ActivationRequested) -> Outcome:
        nonlocal count
        count += 1
        return "complete" if count == 1 else "idle"

    hooks = Hooks([NamedHook("slow_first", slow_first)], timeout=60)
    async with (
        session_service(nc, topology, store),
        StandInLauncher(nc, topology, store, useful_then_idle) as launcher,
        running(nc, topology, store, database_url, hooks) as scheduler,
    ):
        await world.signal(session)
        [a1] = await requests(launcher, 1)
        await eventually(lambda: asyncio.sleep(0, seen), lambda s: len(s) == 1, what="a1's review")
        await world.signal(session)
        [_, a2] = await requests(launcher, 2)
        await eventually(
            lambda: asyncio.sleep(0, scheduler.world.sessions[session].last_ended),
            lambda e: e is not None and e.activation_id == a2.activation_id,
            what="a2 ended (idle) while a1's review still runs",
        )
        release.set()
        [nudge] = await eventually(
            lambda: nudges(world, session), lambda found: len(found) == 1, what="a2's nudge"
        )
        assert nudge.payload["activation_id"] == a2.activation_id
        assert seen[:2] == [a1.activation_id, a2.activation_id]  # (then a3's, maybe)
        [_, _, a3] = await requests(launcher, 3)
        assert a3.reason is ActivationReason.NUDGE


class RefusalsSeen(CommandClient):
    """A command client that notes which commands found no service answering."""

    refused: list[str]

    def __init__(self, nc: NATS, topology: Topology) -> None:
        super().__init__(nc, topology, timeout=5)
        self.refused = []

    async def send(
        self,
        command: Command,
        *,
        actor: str,
        idempotency_key: str | None = None,
        correlation_id: str | None = None,
        timeout: float | None = None,
    ) -> CommandAccepted:
        try:
            return await super().send(
                command,
                actor=actor,
                idempotency_key=idempotency_key,
                correlation_id=correlation_id,
                timeout=timeout,
            )
        except UnavailableError:
            self.refused.append(command.verb)
            raise


async def test_a_nudge_the_unreachable_session_service_missed_is_sent_again_later(
    nc: NATS, topology: Topology, store: EventStore, database_url: str
) -> None:
    world = Sessions(store)
    session = await world.session(await world.project())

    async def idle(_: ActivationRequested) -> Outcome:
        return "idle"

    commands = RefusalsSeen(nc, topology)
    async with (
        StandInLauncher(nc, topology, store, idle) as launcher,
        running(nc, topology, store, database_url, commands=commands),
    ):
        await world.signal(session)
        [a1] = await requests(launcher, 1)
        await eventually(
            lambda: asyncio.sleep(0, commands.refused),
            lambda refused: len(refused) >= 1,
            what="the nudge refused: no session service",
        )
        async with session_service(nc, topology, store):
            [nudge] = await eventually(
                lambda: nudges(world, session),
                lambda found: len(found) == 1,
                timeout=30,  # the retries back off: 1 s, 2 s, 5 s, ...
                what="the nudge sent again",
            )
            assert nudge.payload["activation_id"] == a1.activation_id
            [_, a2] = await requests(launcher, 2)
            assert a2.reason is ActivationReason.NUDGE
            await asyncio.sleep(0.5)
            assert len(await nudges(world, session)) == 1  # the nudged one is not nudged


class CountingStore(EventStore):
    """The scheduler's store, counting its conditional appends."""

    appends = 0

    async def append(
        self,
        aggregate_id: str,
        events: Sequence[DomainEvent],
        expected_version: int,
        meta: EventMeta | None = None,
    ) -> AppendResult:
        self.appends += 1
        return await super().append(aggregate_id, events, expected_version, meta)


async def test_a_conflict_while_the_fold_lags_waits_for_the_fold_instead_of_spinning(
    nc: NATS,
    topology: Topology,
    store: EventStore,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = Sessions(store)
    session = await world.session(await world.project())
    counting = CountingStore(nc, topology)
    async with (
        StandInLauncher(nc, topology, store, Gate()) as launcher,
        running(nc, topology, counting, database_url) as scheduler,
    ):
        follower = scheduler.replica.follower
        real_next = follower.next

        async def lagging_next(timeout: float | None = None) -> LogMessage | None:
            msg = await real_next(timeout)
            if msg is not None:
                await asyncio.sleep(0.5)  # a busy leader's fold, behind the log
            return msg

        def none_queued() -> LogMessage | None:
            return None  # one message per fold: the signal's is folded without what follows

        monkeypatch.setattr(follower, "next", lagging_next)
        monkeypatch.setattr(follower, "next_nowait", none_queued)
        signal = SignalRecorded(
            signal_id=new_id(),
            agent_id="agent",
            kind=SignalKind.USER_MESSAGE,
            priority=Priority.P1,
        )
        recorded = await store.append_next(session, [signal])
        # Another writer moves the session right after: the start decided on the signal's
        # version conflicts, and the fold has not seen the newer version yet.
        checkpoint = CheckpointSaved(checkpoint_id=new_id(), activation_id=new_id(), data={})
        await store.append(session, [checkpoint], recorded.version)
        [a1] = await requests(launcher, 1)
        assert a1.signal_ids == (signal.signal_id,)
        assert 2 <= counting.appends <= 4  # the refused one, then one on the real head


class HandoverRacedStore(EventStore):
    """The scheduler's store: before a handover's append, `race` runs (once) — the test moves
    the world under the decision there; once the append is answered, the fold flows again."""

    race: Callable[[int], Awaitable[None]] | None = None
    flowing = asyncio.Event()

    async def append(
        self,
        aggregate_id: str,
        events: Sequence[DomainEvent],
        expected_version: int,
        meta: EventMeta | None = None,
    ) -> AppendResult:
        race, handover = self.race, any(isinstance(e, SignalsDelivered) for e in events)
        if race is None or not handover:
            return await super().append(aggregate_id, events, expected_version, meta)
        self.race = None
        await race(expected_version)
        try:
            return await super().append(aggregate_id, events, expected_version, meta)
        finally:
            self.flowing.set()


async def test_a_handover_whose_append_conflicts_looks_at_the_session_again(
    nc: NATS,
    topology: Topology,
    store: EventStore,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a handover held the session, its live activation failed (the fold skipped the
    session then: held) and another writer moved the session, so the handover's append
    conflicts. Released, the session is looked at again: its signals start the next
    activation — not left waiting until something else touches the session."""
    world = Sessions(store)
    session = await world.session(await world.project())
    gate = Gate()
    raced = HandoverRacedStore(nc, topology)
    raced.flowing = asyncio.Event()
    raced.flowing.set()
    async with (
        StandInLauncher(nc, topology, store, gate) as launcher,
        running(nc, topology, raced, database_url) as scheduler,
    ):
        first = await world.signal(session)
        [a1] = await requests(launcher, 1)
        s = scheduler.world.sessions[session]
        await eventually(lambda: asyncio.sleep(0, s.live), bool, what="a1 live")
        second = await world.signal(session)  # waits for a1's next tool boundary
        await eventually(lambda: asyncio.sleep(0, second in s.pending), bool, what="pending")

        follower = scheduler.replica.follower
        real_next, real_nowait = follower.next, follower.next_nowait

        async def gated_next(timeout: float | None = None) -> LogMessage | None:
            msg = await real_next(timeout)
            await raced.flowing.wait()
            return msg

        def gated_nowait() -> LogMessage | None:
            return real_nowait() if raced.flowing.is_set() else None

        monkeypatch.setattr(follower, "next", gated_next)
        monkeypatch.setattr(follower, "next_nowait", gated_nowait)

        async def race(version: int) -> None:
            gate.end(a1.activation_id, "fail")  # folded while held: the session is skipped
            await eventually(lambda: asyncio.sleep(0, s.live is None), bool, what="a1 ended")
            raced.flowing.clear()  # the fold stops before the other writer's event
            checkpoint = CheckpointSaved(checkpoint_id=new_id(), activation_id=new_id(), data={})
            await store.append(session, [checkpoint], version)

        raced.race = race
        with pytest.raises(ConflictError):  # not live any more
            await scheduler.take_signals(session, a1.activation_id, ())
        [_, a2] = await requests(launcher, 2)
        assert set(a2.signal_ids) == {first, second}
