"""The operator's bounds on what a project's runtime profile may ask for (`SUZUMIO_BOUNDS__*`):
an activation whose profile asks for more, or names an image not on the list, is refused as it
is planned — not retried — saying what was asked and what is allowed; unset, nothing is
bounded; the backends' own default images always run."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from suzumio.contracts.events import ActivationRequested
from suzumio.contracts.values import Backend, ResourceLimits, RuntimeProfileSpec, Timeouts
from suzumio.orchestrator.directory import Agent, Project
from suzumio.orchestrator.planning import PlanError, Planner
from suzumio.orchestrator.settings import OrchestratorSettings


def planner(monkeypatch: pytest.MonkeyPatch, **env: str) -> Planner:
    for name, value in env.items():
        monkeypatch.setenv(f"SUZUMIO_BOUNDS__{name}", value)
    monkeypatch.setenv("SUZUMIO_DOCKER__IMAGE", "ops.example/runner:1")
    nothing: Any = None
    return Planner(store=nothing, signer=nothing, box=None, settings=OrchestratorSettings())


class PastTheBoundsError(Exception):
    """The plan went on to read the session: the bounds let the profile through."""


def profile_of(planner: Planner, spec: RuntimeProfileSpec) -> RuntimeProfileSpec:
    agent = Agent(id="a1", project_id="p1", runtime_profile="big")
    return planned(planner, agent, Project(id="p1", profiles={"big": spec}))


def planned(planner: Planner, agent: Agent, project: Project) -> RuntimeProfileSpec:
    """The profile the plan runs with; PlanError when the bounds refuse it, which happens
    before the session is read (the plan is stopped there: this planner has no store)."""
    request = ActivationRequested(activation_id="act1", agent_id="a1", signal_ids=())

    async def snapshot(*_: object) -> None:
        raise PastTheBoundsError

    planner._sessions.snapshot = snapshot  # type: ignore[method-assign, assignment]
    with pytest.raises(PastTheBoundsError):
        asyncio.run(planner.plan("s1", request, agent, project))
    return planner.profile(agent, project)


HUGE = RuntimeProfileSpec(
    backend=Backend.DOCKER,
    image="evil.example/miner:latest",
    limits=ResourceLimits(cpus=64, memory_mb=1_000_000, disk_mb=10_000_000, pids=1_000_000),
    timeouts=Timeouts(wall_clock_seconds=7 * 86_400),
)


def test_unset_bounds_allow_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    assert profile_of(planner(monkeypatch), HUGE) == HUGE


@pytest.mark.parametrize(
    ("bound", "value", "said"),
    [
        (
            "MAX_CPUS",
            "4",
            "asks for 64 CPUs; this platform allows at most 4 (SUZUMIO_BOUNDS__MAX_CPUS)",
        ),
        ("MAX_MEMORY_MB", "8192", "1000000 MiB of memory; this platform allows at most 8192"),
        ("MAX_DISK_MB", "20480", "10000000 MiB of disk; this platform allows at most 20480"),
        ("MAX_PIDS", "4096", "1000000 processes; this platform allows at most 4096"),
        ("MAX_WALL_CLOCK_SECONDS", "86400", "604800 seconds of wall clock"),
        ("IMAGES", '["ops.example/*"]', "image 'evil.example/miner:latest' is not one"),
    ],
)
def test_a_profile_past_a_bound_is_refused_saying_why(
    monkeypatch: pytest.MonkeyPatch, bound: str, value: str, said: str
) -> None:
    with pytest.raises(PlanError) as refused:
        profile_of(planner(monkeypatch, **{bound: value}), HUGE)
    assert "runtime profile 'big'" in str(refused.value)
    assert said in str(refused.value)


def test_a_profile_within_the_bounds_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    bounded = planner(
        monkeypatch,
        MAX_CPUS="4",
        MAX_MEMORY_MB="8192",
        MAX_PIDS="4096",
        IMAGES='["ops.example/agents/*", "python:3.12-slim"]',
    )
    fits = RuntimeProfileSpec(
        backend=Backend.KUBERNETES,
        image="ops.example/agents/coder:7",
        limits=ResourceLimits(cpus=4, memory_mb=8192, pids=4096),
    )
    assert profile_of(bounded, fits) == fits
    exact = fits.model_copy(update={"image": "python:3.12-slim"})
    assert profile_of(bounded, exact) == exact
    # The backend's own default image, named or not, and a profile of no image at all.
    own = fits.model_copy(update={"backend": Backend.DOCKER, "image": "ops.example/runner:1"})
    assert profile_of(bounded, own) == own
    assert profile_of(bounded, fits.model_copy(update={"image": None})).image is None
    # Not a prefix match: the pattern's `*` is the only wildcard.
    near = fits.model_copy(update={"image": "ops.example/agents-evil/x:1"})
    with pytest.raises(PlanError):
        profile_of(bounded, near)


def test_the_process_and_pool_backends_run_no_image_of_the_profile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """They run the platform's own runner whatever the profile names: no image to refuse."""
    bounded = planner(monkeypatch, IMAGES="[]")
    for backend in (Backend.PROCESS, Backend.POOL):
        spec = RuntimeProfileSpec(
            backend=backend, image="evil.example/x", pool="p" if backend is Backend.POOL else None
        )
        assert profile_of(bounded, spec) == spec


def test_an_agent_without_a_profile_runs_within_the_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its profile is the platform's default, whose limits nobody chose: a bound below one of
    them (1 GiB, an hour) failed every such agent, saying `runtime profile None`."""
    bounded = planner(
        monkeypatch, MAX_MEMORY_MB="512", MAX_WALL_CLOCK_SECONDS="1800", MAX_CPUS="0.5"
    )
    profile = planned(bounded, Agent(id="a1", project_id="p1"), Project(id="p1"))
    assert (profile.limits.memory_mb, profile.limits.cpus) == (512, 0.5)
    assert profile.timeouts.wall_clock_seconds == 1800
    assert profile.limits.pids == 512  # unbounded: the default's own
