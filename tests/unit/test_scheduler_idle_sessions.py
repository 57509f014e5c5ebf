"""The scheduler's fold keeps every session ever opened (a closed one may be reopened, and its
next signal needs its project and agent): what an idle one costs is kept small, and the last
ended activation it remembers for the review is forgotten once no review looks at it."""

from __future__ import annotations

import gc
import tracemalloc
from datetime import datetime, timedelta

from suzumio.contracts.events import (
    ActivationCompleted,
    ActivationRequested,
    AgentCreated,
    ProjectCreated,
    SessionOpened,
    SignalsDelivered,
)
from suzumio.contracts.ids import new_id
from suzumio.contracts.values import ModelSpec
from suzumio.scheduler.domain.world import World
from tests.unit.test_scheduler_decision_ownership import Leader, activation_of
from tests.unit.test_scheduling_state import T0, Log, opened, signal


def run_once(log: Log, session_id: str, activation_id: str, at: datetime = T0) -> None:
    """One signal to the session, an activation for it, and its end."""
    signal_id = f"sig-{activation_id}"
    log.append(session_id, signal(signal_id), at=at)
    log.append(
        session_id,
        ActivationRequested(
            activation_id=activation_id, agent_id="a", signal_ids=(signal_id,), project_id="p"
        ),
        SignalsDelivered(activation_id=activation_id, signal_ids=(signal_id,)),
        at=at,
    )
    log.append(activation_id, ActivationCompleted(text="done"), at=at)


def test_an_end_past_the_cutoff_is_forgotten_unless_kept() -> None:
    world, log = opened()
    for session_id in ("s2", "s3"):
        log.append(session_id, SessionOpened(project_id="p", agent_id="a"))
    run_once(log, "s", "x1")
    run_once(log, "s2", "x2")
    run_once(log, "s3", "x3", at=T0 + timedelta(minutes=10))
    world.sessions["s"].reviewed = "x1"

    assert world.forget_ended(T0 + timedelta(minutes=5), keep={"s2"}) == 1
    s, s2, s3 = (world.sessions[i] for i in ("s", "s2", "s3"))
    assert (s.last_ended, s.reviewed) == (None, None)
    assert s2.last_ended is not None  # under review: kept
    assert s3.last_ended is not None  # ended after the cutoff
    assert world.forget_ended(T0 + timedelta(minutes=5)) == 1  # its review done: s2's too
    assert world.sessions["s2"].last_ended is None  # (read again: the sweep changed it)
    assert world.sessions["s3"].last_ended is not None
    assert world.forget_ended(T0 + timedelta(minutes=5)) == 0  # nothing left to visit
    # The session is as it was in every other way: its next activation runs and ends.
    run_once(log, "s", "x4")
    assert s.last_ended is not None
    assert s.last_ended.activation_id == "x4"
    assert (s.project_id, s.agent_id, s.opened, s.closed, s.live) == ("p", "a", True, False, None)
    assert world.running_by_project["p"] == 0


def test_an_idle_session_costs_a_few_hundred_bytes() -> None:
    """5,000 sessions, each opened (its project and agent ids decoded afresh, as from the
    log's JSON) and run once, then their ends forgotten: what is left per session is its
    record in the fold, ~460 bytes here. Before this was looked at it was ~1.3 KB: the ended
    activation's summary, each session's own copies of its project's and agent's ids, the
    tables of its emptied dicts, and a dict per record for its attributes."""
    world = World()
    log = Log(world)
    project, agent = new_id(), new_id()
    log.append(project, ProjectCreated(name="p", owner_id="u"))
    log.append(
        agent,
        AgentCreated(project_id=project, name="a", role="a", prompt="", model=ModelSpec(name="m")),
    )
    sessions = [new_id() for _ in range(5_000)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for session_id in sessions:
            copy = "".join(project), "".join(agent)  # distinct strings, as decoding gives
            log.append(session_id, SessionOpened(project_id=copy[0], agent_id=copy[1]))
            run_once(log, session_id, new_id())
        world.forget_ended(T0 + timedelta(hours=1))
        gc.collect()
        per_session = (tracemalloc.get_traced_memory()[0] - before) / len(sessions)
    finally:
        tracemalloc.stop()
    assert len(world.sessions) == len(sessions)
    assert world.activations == {}
    assert per_session < 550, per_session


async def test_the_scheduler_forgets_ends_only_past_its_review_window() -> None:
    leader = Leader(limit=1)
    await leader.open()
    await leader.signal("x")
    [start] = leader.store.of("x")
    await leader.land(start)
    await leader.commit("activation", activation_of(start), ActivationCompleted(text="done"))
    scheduler = leader.scheduler
    x = scheduler.world.sessions["x"]
    assert x.last_ended is not None
    window = timedelta(seconds=scheduler._settings.review_window_seconds)

    scheduler._clock = lambda: T0 + window  # still within it (and its minute of margin)
    scheduler._next_forget = 0.0
    scheduler._forget_old_ends()
    assert x.last_ended is not None

    scheduler._clock = lambda: T0 + window + timedelta(minutes=2)
    scheduler._forget_old_ends()  # not yet: it looks every few minutes
    assert x.last_ended is not None
    scheduler._next_forget = 0.0
    scheduler._forget_old_ends()
    assert x.last_ended is None
