"""The scheduler end to end on real NATS and Postgres: signals in, activation requests out,
with a stand-in launcher playing the orchestrator (it exists in a later issue)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from nats.aio.client import Client as NATS

from suzumio.contracts.commands import TakeSignals
from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.errors import ConflictError, ForbiddenError
from suzumio.contracts.events import (
    ActivationRequested,
    CheckpointSaved,
    SessionMessageAppended,
    SignalClosed,
    SignalRecorded,
)
from suzumio.contracts.ids import new_id
from suzumio.contracts.runner import SignalSpec
from suzumio.contracts.subjects import Topology
from suzumio.contracts.toolpacks import ToolpackManifest
from suzumio.contracts.values import ActivationReason, Author, Priority, SignalKind
from suzumio.platform.bus.commands import CommandClient, CommandServer
from suzumio.platform.bus.eventstore import EventStore
from suzumio.scheduler.domain import policy
from suzumio.scheduler.domain.model import SessionSchedule
from suzumio.scheduler.engine import Scheduler
from suzumio.scheduler.hooks import Hooks, load_hooks
from suzumio.scheduler.settings import SchedulerSettings
from suzumio.session.handlers import build_router as session_router
from suzumio.session.handlers.base import Context
from suzumio.session.repository import Repository
from tests.integration import scheduler_hooks
from tests.scheduling import Outcome, Sessions, StandInLauncher
from tests.support import eventually

BROKER = "system:toolbroker"
HOOKS = "tests.integration.scheduler_hooks"


@asynccontextmanager
async def running(
    nc: NATS,
    topology: Topology,
    store: EventStore,
    database_url: str,
    hooks: Hooks | None = None,
    *,
    commands: CommandClient | None = None,
    **settings: Any,
) -> AsyncIterator[Scheduler]:
    config = SchedulerSettings(retry_backoff_seconds=(0.1, 0.2), **settings)
    scheduler = Scheduler(
        nc,
        topology,
        store,
        commands or CommandClient(nc, topology, timeout=5),
        database_url,
        config,
        hooks or Hooks([]),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(scheduler.run(stop))
    try:
        await eventually(
            lambda: asyncio.sleep(0, scheduler.leading), bool, what="the scheduler to lead"
        )
        yield scheduler
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


class Gate:
    """Activations that run until released: the test decides when each one ends."""

    def __init__(self) -> None:
        self.release: dict[str, asyncio.Future[Outcome]] = {}

    async def __call__(self, request: ActivationRequested) -> Outcome:
        future = self.release.setdefault(
            request.activation_id, asyncio.get_running_loop().create_future()
        )
        return await future

    def end(self, activation_id: str, outcome: Outcome = "complete") -> None:
        self.release.setdefault(
            activation_id, asyncio.get_running_loop().create_future()
        ).set_result(outcome)


async def requests(launcher: StandInLauncher, count: int) -> list[ActivationRequested]:
    found = await eventually(
        lambda: asyncio.sleep(0, launcher.requested),
        lambda r: len(r) >= count,
        what=f"{count} activation requests",
    )
    return [r.event for r in found]


async def take(
    commands: CommandClient, session_id: str, activation_id: str, received: tuple[str, ...] = ()
) -> list[SignalSpec]:
    reply = await commands.send(
        TakeSignals(session_id=session_id, activation_id=activation_id, received=received),
        actor=BROKER,
    )
    return [SignalSpec.model_validate(s) for s in reply.result["signals"]]


async def test_priorities_one_live_activation_and_p1_handover(
    nc: NATS, topology: Topology, store: EventStore, database_url: str, commands: CommandClient
) -> None:
    world = Sessions(store)
    session = await world.session(await world.project())
    gate = Gate()
    async with (
        StandInLauncher(nc, topology, store, gate) as launcher,
        running(nc, topology, store, database_url),
    ):
        # Three signals in one commit: the first activation takes them P1, P2, P3.
        first = await world.signals(
            session, [(Priority.P3, "routine"), (Priority.P2, "soon"), (Priority.P1, "now")]
        )
        [a1] = await requests(launcher, 1)
        assert a1.signal_ids == (first[2], first[1], first[0])
        assert a1.reason is ActivationReason.SIGNALS
        # While it runs: a P1 waits for its next tool boundary, a P2 for its end.
        p1 = await world.signal(session, Priority.P1)
        p2 = await world.signal(session, Priority.P2)
        handed = await take(commands, session, a1.activation_id)
        assert [s.id for s in handed] == [p1]
        later = await world.signal(session, Priority.P1)
        again = await take(commands, session, a1.activation_id)  # the reply was "lost"
        assert [s.id for s in again] == [p1]  # alone: a reply's worth, no more
        handed = await take(commands, session, a1.activation_id, received=(p1,))
        assert [s.id for s in handed] == [later]
        assert await take(commands, session, a1.activation_id, received=(p1, later)) == []
        assert len(launcher.requested) == 1
        with pytest.raises(ForbiddenError):
            await commands.send(
                TakeSignals(session_id=session, activation_id=a1.activation_id),
                actor="user:someone",
            )
        gate.end(a1.activation_id)
        [_, a2] = await requests(launcher, 2)
        assert a2.signal_ids == (p2,)
        with pytest.raises(ConflictError):  # the first one ended: fenced
            await take(commands, session, a1.activation_id)


async def test_a_long_messages_text_and_a_large_payload_are_handed_over_from_the_log(
    nc: NATS, topology: Topology, store: EventStore, database_url: str, commands: CommandClient
) -> None:
    """Every replica holds every pending signal, closed sessions' too: a long message's text
    and a large payload (a member may record many of 256 KiB, due in years) are not kept with
    their signal but read from its commit when handed over — whole, as short ones are from
    memory."""
    world = Sessions(store)
    session = await world.session(await world.project())
    gate = Gate()
    async with (
        StandInLauncher(nc, topology, store, gate) as launcher,
        running(nc, topology, store, database_url) as scheduler,
    ):
        await world.signal(session, Priority.P2)
        [a1] = await requests(launcher, 1)
        texts = {"short": "now, please", "long": "a long message, " * 1_000}
        # (One holds an integer past 64 bits: the API takes it, and a fold that could not
        # measure it stopped every replica.)
        payloads: dict[str, dict[str, Any]] = {
            "short": {"k": 1, "big": 2**64},
            "long": {"k": "v" * 100_000, "big": 2**64},
        }
        ids = {}
        for name, text in texts.items():
            message_id, signal_id = new_id(), new_id()
            ids[name] = signal_id
            author = Author(kind="user", id="u1")
            await store.append_next(
                session,
                [
                    SessionMessageAppended(
                        message_id=message_id, author=author, role="user", text=text
                    ),
                    SignalRecorded(
                        signal_id=signal_id,
                        agent_id="agent",
                        kind=SignalKind.USER_MESSAGE,
                        priority=Priority.P1,
                        message_id=message_id,
                        payload=payloads[name],
                    ),
                ],
            )
        pending = await eventually(
            lambda: asyncio.sleep(0, scheduler.world.sessions[session].pending),
            lambda p: ids["long"] in p,
            what="the signals folded",
        )
        assert (pending[ids["long"]].text, pending[ids["long"]].payload) == (None, {})  # not held
        assert pending[ids["short"]].text == texts["short"]
        assert pending[ids["short"]].payload == payloads["short"]
        handed = await take(commands, session, a1.activation_id)
        assert {s.id: s.text for s in handed} == {ids[n]: t for n, t in texts.items()}
        assert {s.id: s.payload for s in handed} == {ids[n]: p for n, p in payloads.items()}
        gate.end(a1.activation_id)


async def test_p0_replaces_the_live_activation_and_its_signals_queue_again(
    nc: NATS, topology: Topology, store: EventStore, database_url: str, commands: CommandClient
) -> None:
    world = Sessions(store)
    session = await world.session(await world.project())
    gate = Gate()
    async with (
        StandInLauncher(nc, topology, store, gate) as launcher,
        running(nc, topology, store, database_url),
    ):
        m1 = await world.signal(session, Priority.P2)
        [a1] = await requests(launcher, 1)
        stop = await world.signal(session, Priority.P0)
        [_, a2] = await requests(launcher, 2)
        assert (a2.signal_ids, a2.reason, a2.replaces) == (
            (stop,),
            ActivationReason.PREEMPT,
            a1.activation_id,
        )
        assert launcher.cancel_requests == [a1.activation_id]
        with pytest.raises(ConflictError):
            await take(commands, session, a1.activation_id)
        # The replaced activation ended cancelled: its P2 waits for the next start.
        gate.end(a2.activation_id)
        [_, _, a3] = await requests(launcher, 3)
        assert a3.signal_ids == (m1,)


async def test_failed_activations_retry_with_backoff_then_fail_the_signals(
    nc: NATS, topology: Topology, store: EventStore, database_url: str
) -> None:
    world = Sessions(store)
    session = await world.session(await world.project())

    async def always_fail(_: ActivationRequested) -> Outcome:
        return "fail"

    async with (
        StandInLauncher(nc, topology, store, always_fail) as launcher,
        running(nc, topology, store, database_url, retry_budget=3),
    ):
        signal_id = await world.signal(session)
        attempts = await requests(launcher, 3)
        assert [a.attempt for a in attempts] == [1, 2, 3]
        assert [a.reason for a in attempts] == [ActivationReason.SIGNALS] + [
            ActivationReason.RETRY
        ] * 2
        closed = await eventually(
            lambda: world.events(session, SignalClosed),
            lambda found: len(found) == 1,
            what="the signal closed as failed",
        )
        assert closed[0].signal_id == signal_id
        assert closed[0].outcome.value == "failed"
        assert "stand-in failure (3 attempts)" in closed[0].reason
        await asyncio.sleep(0.5)
        assert len(launcher.requested) == 3  # nothing more after the budget


async def test_a_session_event_the_scheduler_does_not_fold_still_moves_its_head(
    nc: NATS, topology: Topology, store: EventStore, database_url: str
) -> None:
    """A checkpoint (a compaction alike) is a session event the scheduler skips; the retry
    decided after it is appended on the session's real head, not refused over and over."""
    world = Sessions(store)
    session = await world.session(await world.project())

    async def checkpoint_then_fail(request: ActivationRequested) -> Outcome:
        saved = CheckpointSaved(
            checkpoint_id=new_id(), activation_id=request.activation_id, data={"step": 1}
        )
        await store.append_next(session, [saved], EventMeta(actor=BROKER))
        return "fail"

    async with (
        StandInLauncher(nc, topology, store, checkpoint_then_fail) as launcher,
        running(nc, topology, store, database_url, retry_budget=3),
    ):
        await world.signal(session)
        attempts = await requests(launcher, 3)
        assert [a.attempt for a in attempts] == [1, 2, 3]


async def test_project_and_pool_limits_with_round_robin_across_projects(
    nc: NATS, topology: Topology, store: EventStore, database_url: str
) -> None:
    world = Sessions(store)
    busy, quiet = await world.project(max_concurrent=2), await world.project(max_concurrent=5)
    busy_sessions = [await world.session(busy) for _ in range(4)]
    quiet_session = await world.session(quiet)
    gate = Gate()
    async with (
        StandInLauncher(nc, topology, store, gate) as launcher,
        running(nc, topology, store, database_url, pool_limits={"process": 3}),
    ):
        for session in busy_sessions:
            await world.signal(session)
        first = await requests(launcher, 2)
        await world.signal(quiet_session)
        third = (await requests(launcher, 3))[2]
        await asyncio.sleep(0.3)
        assert len(launcher.requested) == 3  # busy is at 2, the pool at 3
        assert launcher.requested[2].session_id == quiet_session
        gate.end(third.activation_id)  # frees the pool, but busy is still at its limit
        await asyncio.sleep(0.3)
        assert len(launcher.requested) == 3
        gate.end(first[0].activation_id)
        fourth = await requests(launcher, 4)
        assert launcher.requested[3].session_id in busy_sessions[2:]
        assert fourth[3].activation_id not in {a.activation_id for a in first}


async def test_a_delayed_signal_starts_at_its_time(
    nc: NATS, topology: Topology, store: EventStore, database_url: str
) -> None:
    world = Sessions(store)
    session = await world.session(await world.project())
    async with (
        StandInLauncher(nc, topology, store) as launcher,
        running(nc, topology, store, database_url),
    ):
        not_before = datetime.now(UTC) + timedelta(seconds=1)
        await world.signal(session, Priority.P3, kind=SignalKind.TIMER, not_before=not_before)
        await requests(launcher, 1)
        [requested_at] = await world.times(session, ActivationRequested)
        assert requested_at >= not_before


@asynccontextmanager
async def session_service(nc: NATS, topology: Topology, store: EventStore) -> AsyncIterator[None]:
    """The session service's command handlers, which record what hooks and nudges ask for."""
    server = CommandServer(nc, topology, session_router(Context(Repository(store))))
    await server.start()
    try:
        yield
    finally:
        await server.drain(2)


async def test_hooks_run_before_the_nudge_and_bad_hooks_are_skipped(
    nc: NATS, topology: Topology, store: EventStore, database_url: str
) -> None:
    """Hooks see the agent's state when an activation ended; a broken, a slow and a nonsense
    hook are logged and skipped; a working hook's signal starts the next activation."""
    world = Sessions(store)
    session = await world.session(await world.project())
    names = ("broken", "slow", "nonsense", "follow_up")
    hooks = Hooks(load_hooks([f"{HOOKS}:{n}" for n in names]), timeout=0.3)
    assert len(hooks.hooks) == 4
    scheduler_hooks.SEEN.clear()
    async with (
        session_service(nc, topology, store),
        StandInLauncher(nc, topology, store) as launcher,
        running(nc, topology, store, database_url, hooks),
    ):
        first = await world.signal(session)
        [a1, a2] = await requests(launcher, 2)
        assert a1.signal_ids == (first,)
        [follow] = [
            s for s in await world.events(session, SignalRecorded) if s.signal_id in a2.signal_ids
        ]
        assert (follow.kind, follow.priority) == (SignalKind.CUSTOM, Priority.P3)
        assert follow.payload == {
            "after": session,
            "hook": "tests.integration.scheduler_hooks:follow_up",
        }
        state = scheduler_hooks.SEEN[0]
        assert state.last_activation is not None
        assert (state.last_activation.id, state.last_activation.useful_effect) == (
            a1.activation_id,
            True,
        )
        assert state.last_activation.signal_ids == (first,)
        await eventually(
            lambda: asyncio.sleep(0, scheduler_hooks.SEEN),
            lambda s: len(s) == 2,
            what="the hooks after the second activation",
        )
        await asyncio.sleep(0.3)
        assert len(launcher.requested) == 2  # the hook asked for one follow-up only


async def test_a_toolpacks_own_hook_runs_for_the_agents_that_enable_it_only(
    nc: NATS, topology: Topology, store: EventStore, database_url: str
) -> None:
    """A hook named by a toolpack's manifest sees the ends of its agents' activations, and
    asks for their follow-ups; an agent without the toolpack is none of its business."""
    world = Sessions(store)
    project = await world.project()
    without = await world.session(project)
    with_pack = await world.session(project, toolpacks=("packx",))
    manifest = ToolpackManifest(name="packx", scheduler_hooks=(f"{HOOKS}:follow_up",))
    hooks = Hooks(load_hooks(toolpacks={"packx": manifest}), timeout=0.3)
    scheduler_hooks.SEEN.clear()
    async with (
        session_service(nc, topology, store),
        StandInLauncher(nc, topology, store) as launcher,
        running(nc, topology, store, database_url, hooks),
    ):
        await world.signal(without)
        await requests(launcher, 1)
        await world.signal(with_pack)
        await requests(launcher, 3)  # its signal's, then the hook's follow-up
        await eventually(
            lambda: asyncio.sleep(0, scheduler_hooks.SEEN),
            lambda seen: len(seen) == 2,
            what="the hook after the follow-up",
        )
        await asyncio.sleep(0.3)
    assert [r.session_id for r in launcher.requested] == [without, with_pack, with_pack]
    assert [s.session_id for s in scheduler_hooks.SEEN] == [with_pack, with_pack]
    assert scheduler_hooks.SEEN[0].toolpacks == ("packx",)
    [follow] = [
        s
        for s in await world.events(with_pack, SignalRecorded)
        if s.signal_id in launcher.requested[2].event.signal_ids
    ]
    assert follow.payload["hook"] == f"packx:{HOOKS}:follow_up"


async def test_one_nudge_after_an_activation_without_effect_and_never_a_loop(
    nc: NATS, topology: Topology, store: EventStore, database_url: str
) -> None:
    world = Sessions(store)
    session = await world.session(await world.project())

    async def idle(_: ActivationRequested) -> Outcome:
        return "idle"

    async with (
        session_service(nc, topology, store),
        StandInLauncher(nc, topology, store, idle) as launcher,
        running(nc, topology, store, database_url),
    ):
        await world.signal(session)
        [a1, a2] = await requests(launcher, 2)
        assert a2.reason is ActivationReason.NUDGE
        [nudge] = [
            s for s in await world.events(session, SignalRecorded) if s.kind is SignalKind.NUDGE
        ]
        assert nudge.signal_id in a2.signal_ids
        assert (nudge.priority, nudge.payload["activation_id"]) == (Priority.P2, a1.activation_id)
        await asyncio.sleep(0.5)
        assert len(launcher.requested) == 2  # the nudged activation did nothing either: no loop


async def test_a_new_leader_looks_only_at_sessions_that_may_have_work(
    nc: NATS,
    topology: Topology,
    store: EventStore,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fold keeps every session ever opened, mostly idle: a leader that looked at each
    of them when it took over held its event loop for seconds at a million. The sessions
    with something pending are looked at (and started); the idle ones are not."""
    world = Sessions(store)
    project = await world.project()
    for _ in range(200):
        await world.session(project)
    busy = await world.session(project)
    await world.signal(busy, Priority.P2)
    looked_at: list[str] = []
    decide = policy.decide

    def counting(s: SessionSchedule, *args: Any, **kwargs: Any) -> policy.Plan:
        looked_at.append(s.id)
        return decide(s, *args, **kwargs)

    monkeypatch.setattr(policy, "decide", counting)
    async with (
        StandInLauncher(nc, topology, store) as launcher,
        running(nc, topology, store, database_url),
    ):
        await requests(launcher, 1)
    assert [r.session_id for r in launcher.requested] == [busy]
    assert len(looked_at) < 10, len(looked_at)
