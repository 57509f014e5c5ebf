"""Fixes from a review of the scheduler against DESIGN.md §6 and docs/scheduling.md: an agent
without a runtime profile, or with a non-pool profile naming a pool, counts against the pool the
orchestrator really runs it in; and the
documented fate of a P0's replaced activation that failed on its own."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client as NATS

from suzumio.contracts.events import (
    ActivationCancelRequested,
    ActivationFailed,
    ActivationRequested,
    AgentUpdated,
    RuntimeProfileSet,
    SignalsDelivered,
)
from suzumio.contracts.subjects import Topology
from suzumio.contracts.values import Backend, Priority, RuntimeProfileSpec
from suzumio.platform.bus.eventstore import EventStore
from suzumio.scheduler.domain import policy
from suzumio.scheduler.domain.world import World
from suzumio.scheduler.settings import SchedulerSettings
from tests.integration.test_scheduler import Gate, requests, running
from tests.scheduling import Sessions, StandInLauncher
from tests.unit.test_scheduling_state import T0, opened, signal, start


def test_the_default_backend_is_read_from_the_orchestrators_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SUZUMIO_DEFAULT_BACKEND", "docker")
    assert SchedulerSettings().default_backend is Backend.DOCKER


async def test_an_agent_without_a_runtime_profile_counts_against_the_default_backends_pool(
    nc: NATS, topology: Topology, store: EventStore, database_url: str
) -> None:
    """The orchestrator runs an agent without a runtime profile on SUZUMIO_DEFAULT_BACKEND
    (docker in compose). Counted against `process`, its activations escaped the docker pool's
    limit: both sessions started although `{"docker": 1}`."""
    world = Sessions(store)
    project = await world.project(max_concurrent=5)
    first, second = await world.session(project), await world.session(project)
    gate = Gate()
    async with (
        StandInLauncher(nc, topology, store, gate) as launcher,
        running(
            nc,
            topology,
            store,
            database_url,
            pool_limits={"docker": 1},
            default_backend=Backend.DOCKER,
        ),
    ):
        await world.signal(first)
        (started,) = await requests(launcher, 1)
        assert started.pool == "docker"
        await world.signal(second)
        await asyncio.sleep(0.5)
        assert len(launcher.requested) == 1  # the docker pool is full
        gate.end(started.activation_id)
        later = await requests(launcher, 2)
        assert (launcher.requested[1].session_id, later[1].pool) == (second, "docker")


def test_a_replaced_activation_that_failed_queues_its_signals_again_uncounted() -> None:
    """docs/scheduling.md: a P0's replaced activation that ends any way but completed (here
    failed, not retryable, before the cancel took effect) puts its signals back without a
    failure counted, and its P0 does not preempt the replacement."""
    world, log = opened(budget=1)
    s = world.sessions["s"]
    log.append("s", signal("m1"), signal("stop1", Priority.P0))
    start(log, "x1", "stop1", "m1")
    log.append("s", signal("stop2", Priority.P0))
    log.append(
        "s",
        ActivationCancelRequested(activation_id="x1", reason="replaced"),
        ActivationRequested(
            activation_id="x2", agent_id="a", signal_ids=("stop2",), project_id="p", replaces="x1"
        ),
        SignalsDelivered(activation_id="x2", signal_ids=("stop2",)),
    )
    log.append("x1", ActivationFailed(reason="bad image", retryable=False))
    assert (sorted(s.pending), s.failing, s.consecutive_failures) == (["m1", "stop1"], {}, 0)
    assert all(x.failures == 0 for x in s.pending.values())
    plan = policy.decide(s, T0, startable=True, settings=policy.Settings())
    assert (plan.cancel, plan.start) == (None, None)  # x2 runs on; m1 waits for its tool call
    assert [x.id for x in policy.handover(s, "x2", T0) or []] == ["m1"]


def test_a_profile_of_another_backend_counts_against_that_backend_whatever_pool_it_names() -> None:
    """`pool` means something for backend `pool` only: the orchestrator runs a docker profile
    that names one on docker, so `{"docker": 20}` must count it (it counted against `gpu`)."""
    world, log = opened()  # the agent's profile `gpu`: backend pool, pool gpu
    assert world.pool_of("a") == "gpu"
    spec = RuntimeProfileSpec(backend=Backend.DOCKER, pool="gpu")
    log.append("p", RuntimeProfileSet(name="gpu", spec=spec))
    assert world.pool_of("a") == "docker"
    log.append("a", AgentUpdated(runtime_profile_cleared=True))
    assert world.pool_of("a") == "process"  # no profile: the default backend
    assert World(default_backend=Backend.KUBERNETES).pool_of("nobody") == "kubernetes"
