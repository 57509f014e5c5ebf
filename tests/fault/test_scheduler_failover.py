"""The scheduler under load and under failure: two replicas, a leader that stops mid-load, and
a scheduler process killed with SIGKILL and restarted. Afterwards the log must show never two
live activations for one session, and every signal done by exactly one completed activation
or closed as failed; nothing lost, nothing twice."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from nats.aio.client import Client as NATS

from suzumio.contracts.events import ActivationRequested
from suzumio.contracts.subjects import Topology
from suzumio.contracts.values import Priority
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.eventstore import EventStore
from suzumio.scheduler.engine import Scheduler
from suzumio.scheduler.hooks import Hooks
from suzumio.scheduler.settings import SchedulerSettings
from suzumio.testing.processes import ServiceProcess
from tests.scheduling import Audit, Outcome, Sessions, StandInLauncher, audit
from tests.support import eventually

PRIORITIES = [Priority.P0] * 5 + [Priority.P1] * 50 + [Priority.P2] * 25 + [Priority.P3] * 20
SETTINGS = {"retry_backoff_seconds": (0.05, 0.1), "retry_budget": 3}


def seeded() -> random.Random:
    seed = int(os.environ.get("SUZUMIO_FAULT_SEED", random.randrange(1 << 30)))
    print(f"SUZUMIO_FAULT_SEED={seed}")  # noqa: T201 - to replay a failure
    return random.Random(seed)


def mostly_completes(rng: random.Random) -> object:
    async def behaviour(_: ActivationRequested) -> Outcome:
        await asyncio.sleep(rng.uniform(0.002, 0.03))
        return "fail" if rng.random() < 0.1 else "complete"

    return behaviour


async def sessions(store: EventStore, projects: int, per_project: int) -> list[str]:
    world = Sessions(store)
    found = []
    for _ in range(projects):
        project = await world.project(max_concurrent=per_project)
        found += [await world.session(project) for _ in range(per_project)]
    return found


async def fire(
    store: EventStore,
    targets: list[str],
    count: int,
    rng: random.Random,
    *,
    pause: float = 0.0,
    sent: list[str] | None = None,
) -> list[str]:
    """`count` signals at random sessions, 50 at a time in flight, `pause` s between; each
    batch is added to `sent` as it lands."""
    world = Sessions(store)
    ids: list[str] = [] if sent is None else sent
    for start in range(0, count, 50):
        batch = [
            world.signal(rng.choice(targets), rng.choice(PRIORITIES))
            for _ in range(min(50, count - start))
        ]
        ids += await asyncio.gather(*batch)
        await asyncio.sleep(pause)
    return ids


def settled(result: Audit, signal_ids: list[str]) -> bool:
    return all(result.completed_deliveries(s) or s in result.closed_failed for s in signal_ids)


async def settle(nc: NATS, topology: Topology, signal_ids: list[str]) -> Audit:
    return await eventually(
        lambda: audit(nc, topology),
        lambda result: settled(result, signal_ids),
        timeout=120,
        what="every signal done or failed",
    )


def check(result: Audit, signal_ids: list[str]) -> None:
    assert result.violations == []
    assert set(signal_ids) <= result.recorded
    for signal_id in signal_ids:
        done = result.completed_deliveries(signal_id)
        failed = signal_id in result.closed_failed
        assert (len(done), failed) in {(1, False), (0, True)}, (signal_id, done, failed)


@asynccontextmanager
async def replica(
    nc: NATS, topology: Topology, database_url: str, stop: asyncio.Event
) -> AsyncIterator[Scheduler]:
    scheduler = Scheduler(
        nc,
        topology,
        EventStore(nc, topology),
        CommandClient(nc, topology),
        database_url,
        SchedulerSettings(**SETTINGS),  # type: ignore[arg-type]
        Hooks([]),
    )
    task = asyncio.create_task(scheduler.run(stop))
    try:
        yield scheduler
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def test_two_replicas_1000_signals_100_sessions_and_a_failover(
    nc: NATS, topology: Topology, store: EventStore, database_url: str
) -> None:
    rng = seeded()
    targets = await sessions(store, projects=10, per_project=10)
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    behaviour = mostly_completes(rng)
    async with (
        StandInLauncher(nc, topology, store, behaviour) as launcher,  # type: ignore[arg-type]
        replica(nc, topology, database_url, stop_a) as a,
        replica(nc, topology, database_url, stop_b) as b,
    ):
        await eventually(lambda: asyncio.sleep(0, a.leading or b.leading), bool, what="a leader")
        signal_ids = await fire(store, targets, 500, rng)
        leader, stop_leader = (a, stop_a) if a.leading else (b, stop_b)
        stop_leader.set()  # the leader goes away mid-load; the standby takes over
        standby = b if leader is a else a
        signal_ids += await fire(store, targets, 500, rng)
        await eventually(lambda: asyncio.sleep(0, standby.leading), bool, what="a failover")
        result = await settle(nc, topology, signal_ids)
        assert len(launcher.requested) == result.requested
    check(result, signal_ids)
    assert result.requested >= 100
    print(f"activations {result.requested}, failed signals {len(result.closed_failed)}")  # noqa: T201


async def test_a_scheduler_killed_mid_load_loses_nothing_and_repeats_nothing(
    nc: NATS,
    topology: Topology,
    store: EventStore,
    database_url: str,
    nats_url: str,
    tmp_path: Path,
) -> None:
    rng = seeded()
    targets = await sessions(store, projects=6, per_project=10)
    env = {
        "SUZUMIO_RETRY_BACKOFF_SECONDS": "[0.05, 0.1]",
        "SUZUMIO_DATA_DIR": str(tmp_path / "data"),
    }

    def scheduler() -> ServiceProcess:
        return ServiceProcess(
            "scheduler", nats_url, database_url, topology, tmp_path / "scheduler.log", env
        ).start()

    # The session service is here for the readiness it gives (projection checkpoints).
    session = ServiceProcess(
        "session", nats_url, database_url, topology, tmp_path / "session.log", env
    ).start()
    proc = scheduler()
    try:
        await asyncio.gather(session.wait_ready(), proc.wait_ready())
        async with StandInLauncher(nc, topology, store, mostly_completes(rng)) as launcher:  # type: ignore[arg-type]
            sent: list[str] = []
            firing = asyncio.create_task(fire(store, targets, 600, rng, pause=0.05, sent=sent))
            for threshold in (150, 300, 450):  # kill at a quarter, a half, three quarters
                await eventually(lambda: asyncio.sleep(0, len(sent)), lambda n, t=threshold: n >= t)  # type: ignore[misc]
                proc.kill()  # SIGKILL, mid-load
                await asyncio.sleep(rng.uniform(0.0, 0.3))
                proc = scheduler()
            before = len(launcher.requested)
            await eventually(  # the last process took over and decides
                lambda: asyncio.sleep(0, len(launcher.requested)),
                lambda n: n > before,
                timeout=30,
                what="decisions after the last restart",
            )
            signal_ids = await firing
            result = await settle(nc, topology, signal_ids)
    finally:
        for p in (proc, session):
            if p.process is not None and p.process.poll() is None:
                p.kill()
    check(result, signal_ids)
