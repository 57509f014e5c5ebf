"""Fixes from a review of the orchestrator, on real NATS and Postgres (the kubernetes backend
against the FAKE API server, `suzumio.testing.fake_kubernetes`): a leader that takes over
leaves a finished sandbox of an ended activation to its cleanup policy, with the activation's
real outcome, and stops only one that still runs; a timeout whose stop fails at first still
ends as a timeout; a cancel that deletes a Job just after its runner recorded its output does
not undo the work, nor does an error of ours or a cancel while a new leader lists the
backends; and the process backend's cleanup policy.

The activations here were launched by a leader that is gone: the log says what became of them
and the backend lists what is left of their sandboxes."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from suzumio.contracts.envelope import DomainEvent, EventMeta
from suzumio.contracts.errors import InvalidError
from suzumio.contracts.events import (
    ActivationCancelled,
    ActivationCancelRequested,
    ActivationCompleted,
    ActivationFailed,
    ActivationOutputRecorded,
    ActivationRequested,
    ActivationStarted,
    ActivationTimedOut,
)
from suzumio.contracts.events.activation import TERMINAL_ACTIVATION_EVENTS
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import ARTIFACTS_BUCKET, Topology
from suzumio.orchestrator.artifacts import ArtifactCollector
from suzumio.orchestrator.backends.base import Backend, Exit, Handle, Health, LaunchPlan
from suzumio.orchestrator.backends.kubernetes import KubernetesBackend
from suzumio.orchestrator.backends.process import RECORDS, ProcessBackend, ProcessSettings
from suzumio.orchestrator.engine import Orchestrator
from suzumio.orchestrator.planning import Planner
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.bus.kv import ensure_object_store
from suzumio.platform.db.pool import Pool
from suzumio.platform.secrets import SecretBox
from suzumio.platform.tokens import TokenSigner
from suzumio.testing.fake_kubernetes import FakeKubernetesServer
from tests.integration.test_kubernetes_backend import NS, settings_for
from tests.support import eventually
from tests.unit.test_kubernetes_render import make_plan
from tests.unit.test_process_isolation_probe import plan_in


@contextlib.asynccontextmanager
async def leading(
    nc: NATS,
    topology: Topology,
    store: EventStore,
    database_url: str,
    pool: Pool,
    tmp_path: Path,
    backends: Mapping[str, Backend],
) -> AsyncIterator[Orchestrator]:
    """An orchestrator on `backends`, once it leads (it reconciles as it begins to)."""
    settings = OrchestratorSettings(
        work_dir=tmp_path / "sandboxes", data_dir=tmp_path, namespace=topology.namespace
    )
    js = nc.jetstream()
    bucket = topology.bucket(ARTIFACTS_BUCKET)
    key = SecretBox.generate_key()
    orchestrator = Orchestrator(
        nc,
        topology,
        store,
        database_url,
        Planner(store, TokenSigner([key]), SecretBox([key]), settings, topology.namespace),
        backends,
        ArtifactCollector(
            js,
            await ensure_object_store(js, bucket),
            bucket,
            pool,
            CommandClient(nc, topology),
            max_bytes=1 << 20,
            max_files=10,
        ),  # fmt: skip
        retention_hours=1,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(orchestrator.run(stop))
    try:
        await eventually(
            lambda: asyncio.sleep(0, orchestrator.leading), bool, timeout=30, what="leading"
        )
        yield orchestrator
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await orchestrator.close()


Lead = Callable[[Mapping[str, Backend]], contextlib.AbstractAsyncContextManager[Orchestrator]]


@pytest.fixture
def lead(
    nc: NATS, topology: Topology, store: EventStore, database_url: str, pool: Pool, tmp_path: Path
) -> Lead:
    """`leading` on this test's servers: given the backends only."""
    return functools.partial(leading, nc, topology, store, database_url, pool, tmp_path)


async def launched_before(
    store: EventStore,
    backend: str,
    *events: DomainEvent,
    requested: bool = True,
    activation_id: str | None = None,
) -> tuple[str, str]:
    """An activation a gone leader launched on `backend`, with `events` after its start on
    its subject (its output, its end): (its session, its id). Not `requested`: its request
    is not in the log (as one ended so long ago that the orchestrator forgot it)."""
    session_id, activation_id = new_id(), activation_id or new_id()
    agent_id, project_id = new_id(), new_id()
    if requested:
        request = ActivationRequested(activation_id=activation_id, agent_id=agent_id, signal_ids=())
        await store.append(session_id, [request], 0)
    start = ActivationStarted(
        session_id=session_id, project_id=project_id, agent_id=agent_id, backend=backend
    )
    await store.append(activation_id, [start, *events], 0)
    return session_id, activation_id


async def terminals(store: EventStore, activation_id: str) -> list[DomainEvent]:
    stream = await store.load("activation", activation_id)
    return [e.data for e in stream.events if e.envelope.type in TERMINAL_ACTIVATION_EVENTS]


class Sandboxes:
    """A backend whose sandboxes are as the test lists them; it records what it is asked. A
    watched sandbox ends once a stop reaches it; the first `failing_stops` stops fail (an
    engine briefly unreachable). A stopped sandbox reports `stopped_as` (how it ended under
    the stop)."""

    name = "fake"

    def __init__(
        self,
        live: list[Handle],
        failing_stops: int = 0,
        stopped_as: Exit = Exit(None, "cancelled", "stopped"),  # noqa: B008 -- immutable
    ) -> None:
        self.live = live
        self.failing_stops = failing_stops
        self.stopped_as = stopped_as
        self.calls: dict[str, list[tuple[str, bool | None]]] = defaultdict(list)
        self._stopped: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.releases = 0

    async def launch(self, plan: LaunchPlan) -> Handle:
        raise AssertionError("nothing is launched here")

    async def watch(self, handle: Handle) -> Exit:
        await self._stopped[handle.activation_id].wait()
        return self.stopped_as

    async def cancel(self, handle: Handle) -> None:
        self.calls[handle.activation_id].append(("cancel", None))
        if self.failing_stops > 0:
            self.failing_stops -= 1
            raise ConnectionError("the engine is briefly unreachable")
        self._stopped[handle.activation_id].set()

    async def cleanup(self, handle: Handle, succeeded: bool) -> None:
        self.calls[handle.activation_id].append(("cleanup", succeeded))

    async def list_live(self) -> list[Handle]:
        return list(self.live)

    async def health(self) -> Health:
        return Health(ok=True)

    async def release(self) -> None:
        self.releases += 1

    async def close(self) -> None:
        return


def cleaned_up(calls: list[tuple[str, bool | None]]) -> bool:
    return bool(calls) and calls[-1][0] == "cleanup"


# -- 1. what a takeover does with the sandboxes of ended activations -----------------------------


async def test_a_takeover_stops_only_running_orphans_and_cleans_up_by_the_real_outcome(
    nc: NATS,
    topology: Topology,
    store: EventStore,
    database_url: str,
    pool: Pool,
    tmp_path: Path,
) -> None:
    """Its cleanup was missed (the leader died after the end): a finished sandbox is not
    stopped, and the cleanup is told whether the activation completed — docker's `on_success`
    must not remove a failure nor keep a success for the wrong reason."""
    _, completed = await launched_before(store, "fake", ActivationCompleted(text="done"))
    _, failed = await launched_before(store, "fake", ActivationFailed(reason="exit 1"))
    _, cancelled = await launched_before(store, "fake", ActivationCancelled(reason="asked"))
    _, forgotten = await launched_before(
        store, "fake", ActivationCompleted(text="long ago"), requested=False
    )
    live = [
        Handle(completed, "fake", "s1", finished=True),
        Handle(failed, "fake", "s2", finished=True),
        Handle(cancelled, "fake", "s3"),  # it still runs: stopped
        Handle(forgotten, "fake", "s4", finished=True),
    ]
    sandboxes = Sandboxes(live)
    async with leading(nc, topology, store, database_url, pool, tmp_path, {"fake": sandboxes}):
        await eventually(
            lambda: asyncio.sleep(0, sandboxes.calls),
            lambda calls: all(cleaned_up(calls.get(h.activation_id, [])) for h in live),
            what="every orphan cleaned up",
        )
    assert sandboxes.calls == {
        completed: [("cleanup", True)],
        failed: [("cleanup", False)],
        cancelled: [("cancel", None), ("cleanup", False)],
        forgotten: [("cleanup", True)],  # its end read from its subject
    }


class CleanupsSeen(KubernetesBackend):
    """The kubernetes backend, saying which activations it cleaned up after."""

    cleaned: list[str]

    async def cleanup(self, handle: Handle, succeeded: bool) -> None:
        await super().cleanup(handle, succeeded)
        self.cleaned.append(handle.activation_id)


@pytest_asyncio.fixture
async def kube() -> AsyncIterator[FakeKubernetesServer]:
    async with FakeKubernetesServer(namespaces=[NS]) as fake:
        yield fake


def job_names(server: FakeKubernetesServer) -> set[str]:
    return {job["metadata"]["name"] for job in server.objects("Job", NS)}


@pytest.mark.parametrize(
    ("policy", "removed_if_completed"), [("never", False), ("on_success", True)]
)
async def test_a_takeover_keeps_the_jobs_the_cleanup_policy_keeps(
    nc: NATS,
    topology: Topology,
    store: EventStore,
    database_url: str,
    pool: Pool,
    tmp_path: Path,
    kube: FakeKubernetesServer,
    policy: str,
    removed_if_completed: bool,
) -> None:
    backend = CleanupsSeen(settings_for(kube, cleanup=policy), topology.namespace)
    backend.cleaned = []
    jobs: dict[str, str] = {}
    for name, end, exit_code in [
        ("completed", ActivationCompleted(text="done"), 0),
        ("failed", ActivationFailed(reason="runner exit 1"), 1),
        ("cancelled", ActivationCancelled(reason="asked"), None),  # its Job still runs
    ]:
        _, activation_id = await launched_before(store, "kubernetes", end)
        handle = await backend.launch(
            make_plan(activation_id=activation_id, namespace=topology.namespace)
        )
        if exit_code is not None:
            kube.finish_job(handle.sandbox_id, exit_code)
        jobs[name] = handle.sandbox_id
    async with leading(nc, topology, store, database_url, pool, tmp_path, {"kubernetes": backend}):
        await eventually(
            lambda: asyncio.sleep(0, backend.cleaned), lambda c: len(c) == 3, what="cleanups"
        )
    kept = {jobs["failed"]} | (set() if removed_if_completed else {jobs["completed"]})
    assert job_names(kube) == kept  # the running one stopped (deleted) all the same


# -- 2. a timeout whose stop fails at first -----------------------------------------------------


async def test_a_timeout_whose_stop_fails_at_first_still_ends_timed_out(
    nc: NATS,
    topology: Topology,
    store: EventStore,
    database_url: str,
    pool: Pool,
    tmp_path: Path,
) -> None:
    _, activation_id = await launched_before(store, "fake")
    handle = Handle(activation_id, "fake", "s1", {"deadline": time.time()})  # past its limit
    sandboxes = Sandboxes([handle], failing_stops=1)
    async with leading(nc, topology, store, database_url, pool, tmp_path, {"fake": sandboxes}):
        ends = await eventually(
            lambda: terminals(store, activation_id), bool, timeout=30, what="the end"
        )
    assert [type(e) for e in ends] == [ActivationTimedOut], ends
    calls = sandboxes.calls[activation_id]
    assert calls.count(("cancel", None)) >= 2  # asked again after the one that failed
    assert calls[-1] == ("cleanup", False)


# -- 3. a cancel that deletes a Job just after its runner finished -----------------------------


async def test_a_job_deleted_by_a_cancel_after_the_output_was_recorded_ends_completed(
    nc: NATS,
    topology: Topology,
    store: EventStore,
    database_url: str,
    pool: Pool,
    tmp_path: Path,
    kube: FakeKubernetesServer,
) -> None:
    """The runner recorded its output; the cancel deletes the Job before it is seen to finish
    (its pod, and the exit code, go with it). The work is done: it ends completed, as on
    docker, where the container keeps its exit code."""
    output = ActivationOutputRecorded(text="finished before the cancel")
    session_id, activation_id = await launched_before(store, "kubernetes", output)
    backend = KubernetesBackend(settings_for(kube), topology.namespace)
    handle = await backend.launch(
        make_plan(activation_id=activation_id, namespace=topology.namespace)
    )
    async with leading(nc, topology, store, database_url, pool, tmp_path, {"kubernetes": backend}):
        cancel = ActivationCancelRequested(activation_id=activation_id, reason="asked")
        await store.append_next(session_id, [cancel], EventMeta(actor="system:scheduler"))
        ends = await eventually(
            lambda: terminals(store, activation_id), bool, timeout=30, what="the end"
        )
    assert handle.sandbox_id not in job_names(kube)  # the cancel did delete it
    assert [type(e) for e in ends] == [ActivationCompleted], ends
    assert ends[0].text == "finished before the cancel"  # type: ignore[attr-defined]


class BrokenWatch(Sandboxes):
    """Watching its sandboxes fails: an error of ours, not the activation's."""

    async def watch(self, handle: Handle) -> Exit:
        raise RuntimeError("the watch broke")


@pytest.mark.parametrize("recorded", [True, False], ids=["output_recorded", "no_output"])
async def test_an_error_of_ours_ends_as_the_recorded_output_says(
    store: EventStore,
    lead: Lead,
    recorded: bool,
) -> None:
    """The orchestrator fails watching a sandbox whose runner had recorded its output: the
    work is done, so it ends completed (a retryable failure would have it done again), and
    the cleanup hears so. Without an output, it fails, retryable."""
    output = ActivationOutputRecorded(text="finished before the error")
    _, activation_id = await launched_before(store, "fake", *([output] if recorded else []))
    sandboxes = BrokenWatch([Handle(activation_id, "fake", "s1")])
    async with lead({"fake": sandboxes}):
        ends = await eventually(
            lambda: terminals(store, activation_id), bool, timeout=30, what="the end"
        )
        await eventually(
            lambda: asyncio.sleep(0, sandboxes.calls[activation_id]), cleaned_up, what="cleanup"
        )
    assert sandboxes.calls[activation_id] == [("cancel", None), ("cleanup", recorded)]
    if recorded:
        assert [type(e) for e in ends] == [ActivationCompleted], ends
        assert ends[0].text == "finished before the error"  # type: ignore[attr-defined]
    else:
        assert [type(e) for e in ends] == [ActivationFailed], ends
        assert ends[0].reason.startswith("orchestrator: RuntimeError")  # type: ignore[attr-defined]
        assert ends[0].retryable  # type: ignore[attr-defined]


async def test_an_error_of_ours_whose_end_cannot_be_stored_still_cleans_up(
    store: EventStore, lead: Lead, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No end could be stored (an event on the subject this release cannot read, say): the
    stopped sandbox is still cleaned up, as failed. Before, the cleanup came only after a
    stored end, and the sandbox stayed while this replica led."""
    _, activation_id = await launched_before(store, "fake")
    sandboxes = BrokenWatch([Handle(activation_id, "fake", "s1")])

    async def unstorable(*_: object, **__: object) -> DomainEvent:
        raise RuntimeError("an event on the subject this release cannot read")

    monkeypatch.setattr(Orchestrator, "_end", unstorable)
    async with lead({"fake": sandboxes}):
        await eventually(
            lambda: asyncio.sleep(0, sandboxes.calls[activation_id]), cleaned_up, what="cleanup"
        )
    assert sandboxes.calls[activation_id] == [("cancel", None), ("cleanup", False)]
    assert await terminals(store, activation_id) == []


async def test_a_replica_that_stops_leading_while_it_ends_an_error_of_ours_leaves_the_sandbox(
    store: EventStore, lead: Lead, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end waits out a store outage and the replica stops leading meanwhile: the next
    leader takes the sandbox over (and collects its files), so this one must not clean it up
    on its way out — only an end that failed for good is cleaned up after."""
    _, activation_id = await launched_before(store, "fake")
    sandboxes = BrokenWatch([Handle(activation_id, "fake", "s1")])
    ending = asyncio.Event()

    async def store_out(*_: object, **__: object) -> DomainEvent:
        ending.set()
        await asyncio.Event().wait()  # retried until the replica stops leading
        raise AssertionError("never ends")

    monkeypatch.setattr(Orchestrator, "_end", store_out)
    async with lead({"fake": sandboxes}):
        await asyncio.wait_for(ending.wait(), 30)
    assert sandboxes.calls[activation_id] == [("cancel", None)]


async def test_a_replica_that_stops_leading_has_its_backends_forget_their_sandboxes(
    store: EventStore, lead: Lead
) -> None:
    """What a backend kept to watch its sandboxes (the pool's dispatches hold their tokens)
    is released when the replica stops leading, not kept for ever: the watching is the next
    leader's."""
    _, activation_id = await launched_before(store, "fake")
    sandboxes = Sandboxes([Handle(activation_id, "fake", "s1")])
    async with lead({"fake": sandboxes}) as orchestrator:
        await eventually(
            lambda: asyncio.sleep(0, activation_id in orchestrator._tasks), bool, what="watched"
        )
        assert sandboxes.releases == 0
    assert sandboxes.releases == 1
    assert sandboxes.calls[activation_id] == []  # its sandbox lives on, for the next leader


class SlowToList(Sandboxes):
    """Listing its sandboxes takes until the test lets it answer."""

    def __init__(self, live: list[Handle]) -> None:
        super().__init__(live)
        self.asked = asyncio.Event()
        self.answer = asyncio.Event()

    async def list_live(self) -> list[Handle]:
        self.asked.set()
        await self.answer.wait()
        return list(self.live)


@pytest.mark.parametrize("refused", [False, True], ids=["stored", "end_refused"])
async def test_a_cancel_while_a_new_leader_lists_does_not_undo_a_recorded_output(
    store: EventStore, lead: Lead, monkeypatch: pytest.MonkeyPatch, refused: bool
) -> None:
    """The gone leader launched it but died before appending its start; its runner finished
    and recorded its output. A cancel arrives while the new leader still lists the backends:
    the work is done, so it ends completed, not cancelled; its sandbox, found afterwards, is
    an orphan, stopped and cleaned up as a success.

    `end_refused`: that end is refused as invalid, as one too large for the bus is. Only the
    watch's path ended such an activation failed: the cancel's left it with no end at all."""
    session_id, activation_id = new_id(), new_id()
    request = ActivationRequested(activation_id=activation_id, agent_id=new_id(), signal_ids=())
    await store.append(session_id, [request], 0)
    await store.append(activation_id, [ActivationOutputRecorded(text="done before it")], 0)
    append = store.append

    async def refusing_completions(aggregate_id: str, events: list[DomainEvent], *a: object,
                                   **kw: object) -> object:  # fmt: skip
        if any(isinstance(e, ActivationCompleted) for e in events):
            raise InvalidError("the event is too large for the bus")
        return await append(aggregate_id, events, *a, **kw)  # type: ignore[arg-type]

    if refused:
        monkeypatch.setattr(store, "append", refusing_completions)
    sandboxes = SlowToList([Handle(activation_id, "fake", "s1")])
    async with lead({"fake": sandboxes}):
        await asyncio.wait_for(sandboxes.asked.wait(), 30)
        cancel = ActivationCancelRequested(activation_id=activation_id, reason="asked")
        await store.append_next(session_id, [cancel], EventMeta(actor="system:scheduler"))
        ends = await eventually(
            lambda: terminals(store, activation_id), bool, timeout=30, what="the end"
        )
        sandboxes.answer.set()
        await eventually(
            lambda: asyncio.sleep(0, sandboxes.calls[activation_id]), cleaned_up, what="cleanup"
        )
    assert sandboxes.calls[activation_id] == [("cancel", None), ("cleanup", not refused)]
    if refused:
        assert [type(e) for e in ends] == [ActivationFailed], ends
        assert "too large for the bus" in ends[0].reason  # type: ignore[attr-defined]
    else:
        assert [type(e) for e in ends] == [ActivationCompleted], ends


async def test_a_sandbox_listed_while_its_activation_is_being_ended_is_cleared_after_the_end(
    store: EventStore, lead: Lead, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, but the listing comes back while the cancel's end is still being stored:
    the sandbox was skipped as "being launched" and left running, unwatched, until the next
    leader. Now it is cleared once the end is in, by that end."""
    session_id, activation_id = new_id(), new_id()
    request = ActivationRequested(activation_id=activation_id, agent_id=new_id(), signal_ids=())
    await store.append(session_id, [request], 0)
    await store.append(activation_id, [ActivationOutputRecorded(text="done before it")], 0)
    append, storing, stored = store.append, asyncio.Event(), asyncio.Event()

    async def slow_ends(aggregate_id: str, events: list[DomainEvent], *a: object,
                        **kw: object) -> object:  # fmt: skip
        if aggregate_id == activation_id:
            storing.set()
            await stored.wait()
        return await append(aggregate_id, events, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "append", slow_ends)
    sandboxes = SlowToList([Handle(activation_id, "fake", "s1")])
    async with lead({"fake": sandboxes}) as orchestrator:
        await asyncio.wait_for(sandboxes.asked.wait(), 30)
        cancel = ActivationCancelRequested(activation_id=activation_id, reason="asked")
        await store.append_next(session_id, [cancel], EventMeta(actor="system:scheduler"))
        await asyncio.wait_for(storing.wait(), 30)
        sandboxes.answer.set()  # the listing comes back while the end waits
        await eventually(
            lambda: asyncio.sleep(0, orchestrator._orphaned), bool, what="the orphan seen"
        )
        assert sandboxes.calls[activation_id] == []  # nothing before the end decides
        stored.set()
        await eventually(
            lambda: asyncio.sleep(0, sandboxes.calls[activation_id]), cleaned_up, what="cleanup"
        )
    assert [type(e) for e in await terminals(store, activation_id)] == [ActivationCompleted]
    assert sandboxes.calls[activation_id] == [("cancel", None), ("cleanup", True)]


async def test_a_cancel_folded_in_the_turn_a_listing_comes_back_still_clears_the_sandbox(
    store: EventStore, lead: Lead
) -> None:
    """The gone leader launched it and died before appending its start. The new leader's
    listing comes back, and in the same turn of the loop (before the task that ends it first
    runs) a cancel is folded: the activation was in `_tasks` and not yet `_ending`, so its
    sandbox looked like one being launched and was left running, owned by no one, until the
    next takeover. Now it is stopped and cleaned up after the end."""
    session_id, activation_id = new_id(), new_id()
    request = ActivationRequested(activation_id=activation_id, agent_id=new_id(), signal_ids=())
    await store.append(session_id, [request], 0)
    sandboxes = SlowToList([Handle(activation_id, "fake", "s1")])
    async with lead({"fake": sandboxes}) as orchestrator:
        await asyncio.wait_for(sandboxes.asked.wait(), 30)
        match = orchestrator._match

        async def cancel_folded_first(live: dict[str, Handle], unlisted: set[str]) -> None:
            cancel = ActivationCancelRequested(activation_id=activation_id, reason="asked")
            orchestrator._apply(session_id, cancel)  # as the fold does, in this very turn
            await match(live, unlisted)

        orchestrator._match = cancel_folded_first  # type: ignore[method-assign]
        sandboxes.answer.set()
        await eventually(
            lambda: asyncio.sleep(0, sandboxes.calls[activation_id]), cleaned_up, what="cleanup"
        )
    assert [type(e) for e in await terminals(store, activation_id)] == [ActivationCancelled]
    assert sandboxes.calls[activation_id] == [("cancel", None), ("cleanup", False)]


# -- 4. the process backend's cleanup policy ---------------------------------------------------


def exiting_interpreter(tmp_path: Path, code: int) -> str:
    """Stands in for the runner's Python: exits at once with `code`."""
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\nexit {code}\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize(
    ("policy", "succeeded", "removed"),
    [
        ("always", True, True),
        ("always", False, True),
        ("on_success", True, True),
        ("on_success", False, False),
        ("never", True, False),
    ],
)
async def test_the_process_cleanup_follows_the_policy(
    tmp_path: Path, policy: str, succeeded: bool, removed: bool
) -> None:
    python = exiting_interpreter(tmp_path, 0 if succeeded else 1)
    settings = ProcessSettings.model_validate(
        {"python": python, "isolate": False, "cleanup": policy}
    )
    backend = ProcessBackend(tmp_path / "sandboxes", settings)
    plan = plan_in(tmp_path)
    handle = await backend.launch(plan)
    assert (await asyncio.wait_for(backend.watch(handle), 10)).code == (0 if succeeded else 1)
    await backend.cleanup(handle, succeeded=succeeded)
    assert plan.host_dir.exists() is not removed
    assert plan.session_dir.exists()  # the session's, never the activation's to remove
    listed = await backend.list_live()
    if removed:
        assert listed == []
    else:  # kept as a container is: there to look at, found again, and nothing to stop
        assert (plan.host_dir / "runner.log").exists()
        assert (tmp_path / "sandboxes" / RECORDS / f"{plan.activation_id}.json").exists()
        assert [(h.activation_id, h.finished) for h in listed] == [(plan.activation_id, True)]


def test_the_process_cleanup_policy_is_validated() -> None:
    with pytest.raises(ValueError, match="cleanup"):
        ProcessSettings.model_validate({"cleanup": "sometimes"})
    assert ProcessSettings().cleanup == "always"


class SilentAfterFirstTerm(Sandboxes):
    """Lists its sandboxes once (the first lead term's takeover); silent after (an engine
    that went unreachable)."""

    def __init__(self, live: list[Handle]) -> None:
        super().__init__(live, failing_stops=10**6)
        self.listings = 0

    async def list_live(self) -> list[Handle]:
        self.listings += 1
        if self.listings > 1:
            raise ConnectionError("the engine is unreachable")
        return list(self.live)


async def test_a_replica_leading_again_ends_a_cancel_on_a_silent_backend_at_once(
    store: EventStore, database_url: str, lead: Lead
) -> None:
    """A replica that led, stepped down (its lock's connection lost) and leads again matched
    nothing in its new term (the backend cannot list), yet it kept the handle of its last
    term: a cancel only stopped that (maybe stale) sandbox, again and again, and the
    activation read running until the engine answered — or its wall clock ran out. As a
    replica new to the lead does, it now ends the activation at once."""
    session_id, activation_id = await launched_before(store, "fake")
    sandboxes = SilentAfterFirstTerm([Handle(activation_id, "fake", "s1")])
    async with lead({"fake": sandboxes}) as orchestrator:
        await eventually(
            lambda: asyncio.sleep(0, activation_id in orchestrator._tasks), bool, what="watched"
        )
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name LIKE 'suzumio-leader-orchestrator%'"
            )
        finally:
            await conn.close()
        await eventually(
            lambda: asyncio.sleep(0, sandboxes.listings), lambda n: n > 1, what="a second term"
        )
        await store.append_next(
            session_id,
            [ActivationCancelRequested(activation_id=activation_id, reason="stop it")],
            EventMeta(actor="system:scheduler"),
        )
        ended = await eventually(
            lambda: terminals(store, activation_id), bool, timeout=10, what="the end"
        )
    assert [type(e) for e in ended] == [ActivationCancelled]


async def test_a_kept_directory_counts_from_its_activations_end_however_it_ended(
    nc: NATS, topology: Topology, store: EventStore, database_url: str, pool: Pool, tmp_path: Path
) -> None:
    """Retention counts from an activation's end, read off its directory's time: refreshed by
    the end of a watched sandbox only, the directory of one ended otherwise — its sandbox gone
    when a new leader took over, say — kept its launch's time, and a long activation's went
    at the next sweep after its end."""
    _, activation_id = await launched_before(store, "fake")  # started; its sandbox is gone
    settings = OrchestratorSettings(
        work_dir=tmp_path / "sandboxes", data_dir=tmp_path, namespace=topology.namespace
    )
    kept = settings.activation_dir(activation_id)
    kept.mkdir(parents=True)
    launched = time.time() - 3 * 3600  # launched three hours ago, past the retention
    os.utime(kept, (launched, launched))
    before = time.time()

    async with leading(nc, topology, store, database_url, pool, tmp_path, {"fake": Sandboxes([])}):

        async def told() -> list[str]:
            return [e.envelope.type for e in (await store.load("activation", activation_id)).events]

        await eventually(told, lambda types: "activation.failed" in types, what="its end")
        await eventually(
            lambda: asyncio.sleep(0, kept.stat().st_mtime), lambda t: t >= before, what="its time"
        )
    assert kept.is_dir()


class CleanupFailsOnce(Sandboxes):
    """Sandboxes that end by themselves as soon as watched, and whose first cleanup fails
    (an engine briefly unreachable)."""

    def __init__(self, live: list[Handle]) -> None:
        super().__init__(live)
        self.failing_cleanups = 1

    async def watch(self, handle: Handle) -> Exit:
        return Exit(0, "exited")

    async def cleanup(self, handle: Handle, succeeded: bool) -> None:
        await super().cleanup(handle, succeeded)
        if self.failing_cleanups > 0:
            self.failing_cleanups -= 1
            raise ConnectionError("the engine is briefly unreachable")


async def test_a_cleanup_that_fails_after_the_end_stops_nothing(
    nc: NATS, topology: Topology, store: EventStore, database_url: str, pool: Pool, tmp_path: Path
) -> None:
    """The activation ended as its sandbox did; the cleanup after fails once. Taken for a
    failure of the activation's, it stopped — deleted — the finished sandbox that its
    cleanup policy may keep, and said the activation erred."""
    _, activation_id = await launched_before(store, "fake")
    sandboxes = CleanupFailsOnce([Handle(activation_id, "fake", "s1")])
    async with leading(nc, topology, store, database_url, pool, tmp_path, {"fake": sandboxes}):

        async def told() -> list[str]:
            return [e.envelope.type for e in (await store.load("activation", activation_id)).events]

        await eventually(told, lambda types: types[-1] in TERMINAL_ACTIVATION_EVENTS, what="end")
        await eventually(
            lambda: asyncio.sleep(0, sandboxes.calls[activation_id]), bool, what="its cleanup"
        )
        await asyncio.sleep(0.5)  # what a failure path would do next, done by now
    assert sandboxes.calls[activation_id] == [("cleanup", False)]


async def test_a_recovery_that_failed_is_tried_again_while_leading(
    store: EventStore, lead: Lead, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its story could not be read for more than passing trouble (an event of a newer
    release, a fault of this code) the first times the new leader asked: the activation was
    left `running` until the next leader — and its session, one activation at a time, with
    it. It is tried again, and ends once it can be read (lost: its sandbox is gone)."""
    monkeypatch.setattr("suzumio.orchestrator.engine.RECOVER_FIRST_SECONDS", 0.05)
    _, activation_id = await launched_before(store, "fake")
    load, refusals = store.load, [2]

    async def unreadable_twice(aggregate: str, aggregate_id: str, **kw: object) -> object:
        if aggregate_id == activation_id and refusals[0] > 0:
            refusals[0] -= 1
            raise ValueError("an event of a newer release")  # not trouble: not waited out
        return await load(aggregate, aggregate_id, **kw)  # type: ignore[arg-type]

    async def ended_as() -> list[DomainEvent]:  # read as the log has it, never refused
        stream = await load("activation", activation_id)
        return [e.data for e in stream.events if e.envelope.type in TERMINAL_ACTIVATION_EVENTS]

    monkeypatch.setattr(store, "load", unreadable_twice)
    async with lead({"fake": Sandboxes([])}):
        ends = await eventually(ended_as, bool, timeout=30, what="the end")
    assert refusals == [0]
    assert [type(e) for e in ends] == [ActivationFailed], ends


async def test_a_cancel_is_carried_out_while_a_failed_recovery_waits(
    store: EventStore, lead: Lead, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recovery that failed waits to be tried again; a cancel that comes meanwhile ends the
    activation at once, as it did before recoveries were tried again — not when (if ever)
    the recovery next succeeds."""
    monkeypatch.setattr("suzumio.orchestrator.engine.RECOVER_FIRST_SECONDS", 3600.0)
    session_id, activation_id = new_id(), new_id()
    request = ActivationRequested(activation_id=activation_id, agent_id=new_id(), signal_ids=())
    await store.append(session_id, [request], 0)
    load, refusals = store.load, [1]

    async def unreadable_once(aggregate: str, aggregate_id: str, **kw: object) -> object:
        if aggregate_id == activation_id and refusals[0] > 0:
            refusals[0] -= 1
            raise ValueError("an event of a newer release")
        return await load(aggregate, aggregate_id, **kw)  # type: ignore[arg-type]

    async def ended_as() -> list[DomainEvent]:
        stream = await load("activation", activation_id)
        return [e.data for e in stream.events if e.envelope.type in TERMINAL_ACTIVATION_EVENTS]

    monkeypatch.setattr(store, "load", unreadable_once)
    async with lead({"fake": Sandboxes([])}) as orchestrator:
        await eventually(
            lambda: asyncio.sleep(0, orchestrator._waiting_to_recover), bool, what="waiting"
        )
        cancel = ActivationCancelRequested(activation_id=activation_id, reason="asked")
        await store.append_next(session_id, [cancel], EventMeta(actor="system:scheduler"))
        ends = await eventually(ended_as, bool, timeout=30, what="the end")
    assert [type(e) for e in ends] == [ActivationCancelled], ends
