"""Reconciliation when a replica takes the lead from one that launched the activations (process
backend, real services): a backend that cannot list its sandboxes at first has none of its
activations declared lost; a cancel asked while no replica led stops the sandbox found again;
the wall-clock limit still applies to it; an activation whose sandbox is gone but whose output
is on record ends as that output says, not as lost. The first orchestrator is stopped — its
sandboxes live on, as after a failover — and a second one is started on the same directory."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.events import (
    ActivationCancelRequested,
    ActivationCompleted,
    ActivationOutputRecorded,
    ActivationRequested,
    ActivationStarted,
    ActivationTimedOut,
)
from suzumio.contracts.ids import new_id
from suzumio.orchestrator import engine
from suzumio.orchestrator.backends.base import Backend, Exit, Handle
from suzumio.orchestrator.backends.process import RECORDS, ProcessBackend
from suzumio.orchestrator.engine import Orchestrator, Tracked
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from tests.backend_suite import TERMINAL, Harness, harness
from tests.e2e.api import new_world
from tests.e2e.runner_env import request_activation
from tests.e2e.stack import Stack
from tests.support import eventually


async def process_backend(settings: OrchestratorSettings) -> Backend:
    return ProcessBackend(settings.sandboxes())


class UnreachableAtFirst(ProcessBackend):
    """The process backend, its listing failing the first times it is asked — as a Docker
    engine or the Kubernetes API briefly unreachable while a replica takes the lead."""

    def __init__(self, root: Path, failures: int) -> None:
        super().__init__(root)
        self.failures = failures
        self.listings = 0

    async def list_live(self) -> list[Handle]:
        self.listings += 1
        if self.listings <= self.failures:
            raise ConnectionError("the engine is briefly unreachable")
        return await super().list_live()


async def started_then_left(
    h: Harness, world_name: str, wall_clock: int | None = None
) -> tuple[str, str]:
    """An activation started by `h`'s orchestrator, which is stopped right after (by the
    caller leaving `h`): (its session, its id)."""
    w = await h.world(world_name, wall_clock=wall_clock)
    activation_id = await h.request(w)
    await h.started(activation_id)
    return w.session_id, activation_id


async def story(platform: Stack, activation_id: str) -> list[str]:
    return [
        e.envelope.type for e in (await platform.store.load("activation", activation_id)).events
    ]


async def test_a_backend_that_cannot_list_at_first_has_no_activation_lost(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    model.script([Reply.text("finished under the new leader", delay=10)])
    async with harness(platform, model, tmp_path, process_backend, "process") as h:
        _, activation_id = await started_then_left(h, "unlisted")
    flaky: list[UnreachableAtFirst] = []

    async def unreachable_at_first(settings: OrchestratorSettings) -> Backend:
        flaky.append(UnreachableAtFirst(settings.sandboxes(), failures=2))
        return flaky[0]

    async with harness(platform, model, tmp_path, unreachable_at_first, "process") as h:
        # Until the listing is asked again (or, wrongly, the activation ended as lost):
        meanwhile = await eventually(
            lambda: story(platform, activation_id),
            lambda types: bool(terminals(types)) or flaky[0].listings >= 2,
            what="a second listing",
        )
        assert not terminals(meanwhile), meanwhile  # not lost while its backend was silent
        ended = await h.ended(activation_id, timeout=60)
    assert flaky[0].listings >= 3  # asked again until it answered
    assert terminals(ended) == ["activation.completed"], ended
    assert ended.count("activation.started") == 1, ended  # not launched a second time
    stream = await platform.store.load("activation", activation_id)
    assert stream.events[-1].data.text == "finished under the new leader"  # type: ignore[attr-defined]


async def test_a_cancel_asked_while_no_replica_led_stops_the_sandbox_found_again(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    model.script([Reply.text("never in time", delay=90)])
    async with harness(platform, model, tmp_path, process_backend, "process") as h:
        session_id, activation_id = await started_then_left(h, "cancelled")
    await platform.store.append_next(
        session_id,
        [ActivationCancelRequested(activation_id=activation_id, reason="asked meanwhile")],
        EventMeta(actor="system:scheduler"),
    )
    async with harness(platform, model, tmp_path, process_backend, "process") as h:
        ended = await h.ended(activation_id, timeout=30)
        assert terminals(ended) == ["activation.cancelled"], ended
        await eventually(h.live_ids, lambda ids: activation_id not in ids, what="cleanup")


async def test_the_wall_clock_limit_applies_to_a_sandbox_found_again(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    """Its handle keeps no deadline: the limit comes from its profile, counted from its start
    in the log."""
    model.script([Reply.text("too late", delay=90)])
    async with harness(platform, model, tmp_path, process_backend, "process") as h:
        _, activation_id = await started_then_left(h, "slowfound", wall_clock=6)
    async with harness(platform, model, tmp_path, process_backend, "process") as h:
        ended = await h.ended(activation_id, timeout=40)
        assert terminals(ended) == ["activation.timed_out"], ended
        timed_out = (await platform.store.load("activation", activation_id)).events[-1].data
        assert isinstance(timed_out, ActivationTimedOut)
        assert timed_out.timeout_seconds == 6
        await eventually(h.live_ids, lambda ids: activation_id not in ids, what="cleanup")


async def test_a_finished_activation_whose_sandbox_is_gone_ends_as_its_output_says(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    """It finished while no orchestrator watched, and its sandbox was removed before one
    came back (a Kubernetes Job by its TTL; here: the process backend's record): its work is
    not done again, and what it left in out/ is still recorded."""
    model.script(
        [
            Reply.tool_calls([ToolCall("file_write", {"path": "out/left.txt", "content": "x"})]),
            Reply.text("finished unwatched", delay=4),
        ]
    )
    async with harness(platform, model, tmp_path, process_backend, "process") as h:
        w = await h.world("gone")
        activation_id = await h.request(w)
        await h.started(activation_id)
        settings = h.orchestrator._planner.settings
    host_dir = settings.activation_dir(activation_id)
    await eventually(
        lambda: story(platform, activation_id),
        lambda types: "activation.output_recorded" in types,
        timeout=30,
        what="the output",
    )
    await eventually(
        lambda: _exists(host_dir / "exit_code"), bool, timeout=30, what="the runner's exit"
    )
    (host_dir.parent.parent / RECORDS / f"{activation_id}.json").unlink()  # the sandbox is gone
    async with harness(platform, model, tmp_path, process_backend, "process") as h:
        ended = await h.ended(activation_id, timeout=30)
    assert terminals(ended) == ["activation.completed"], ended
    stream = await platform.store.load("activation", activation_id)
    assert stream.events[-1].data.text == "finished unwatched"  # type: ignore[attr-defined]
    async with platform.client(w.key) as c:
        await eventually(
            lambda: c.get(f"/v1/projects/{w.project_id}/artifacts"),
            lambda r: [a["path"] for a in r.json()["items"]] == ["left.txt"],
            what="its out/ file as an artifact",
        )


@pytest.mark.parametrize(
    ("reason", "terminal"),
    [
        ("budget_exhausted", "activation.completed"),
        ("waiting", "activation.completed"),
        ("failed", "activation.failed"),
    ],
)
async def test_a_gone_sandbox_ends_as_the_recorded_outputs_reason_says(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path, reason: str, terminal: str
) -> None:
    """As the runner's exit after that output would have ended it (4, 3: completed with the
    reason; 5: failed with its text) — the log as a replica finds it: started, output
    recorded, no sandbox anywhere."""
    world = await new_world(platform, f"out{new_id()[-5:]}")
    activation_id = await request_activation(platform, world)
    meta = EventMeta(actor="system:test")
    started = ActivationStarted(
        session_id=world.session_id,
        project_id=world.project_id,
        agent_id=world.agent_id,
        backend="process",
        sandbox_id="999999",
    )
    output = ActivationOutputRecorded(text=f"said {reason}", reason=reason)  # type: ignore[arg-type]
    await platform.store.append_next(activation_id, [started, output], meta)
    async with harness(platform, model, tmp_path, process_backend, "process") as h:
        ended = await h.ended(activation_id, timeout=30)
    assert terminals(ended) == [terminal], ended
    end = (await platform.store.load("activation", activation_id)).events[-1].data
    if terminal == "activation.completed":
        assert (end.text, end.reason) == (f"said {reason}", reason)  # type: ignore[attr-defined]
    else:
        assert end.exit_code == 5  # type: ignore[attr-defined]
        assert "said failed" in end.reason  # type: ignore[attr-defined]
        assert "lost" not in end.reason  # type: ignore[attr-defined]


def test_an_exit_the_backend_timed_out_ends_timed_out() -> None:
    """A Kubernetes Job past its active deadline (or a pool dispatch no worker started in
    time) is a timeout, not a failure."""
    request = ActivationRequested(activation_id=new_id(), agent_id=new_id(), signal_ids=())
    tracked = Tracked(new_id(), request, timeout_seconds=30.0)
    exit_ = Exit(None, "timeout", "DeadlineExceeded")
    assert Orchestrator._terminal(tracked, exit_, None) == ActivationTimedOut(timeout_seconds=30)


def test_a_runner_killed_after_it_recorded_its_output_ends_as_it_said() -> None:
    """A pool worker's drain kills a runner still sending its output (the broker slow), or
    reaping its commands after it: its work is done. It ended failed (killed, retryable),
    and the scheduler had it all done again."""
    request = ActivationRequested(activation_id=new_id(), agent_id=new_id(), signal_ids=())
    tracked = Tracked(new_id(), request)
    output = ActivationOutputRecorded(text="done", reason="completed")
    killed = Exit(None, "killed", "shutdown: signal 9")
    end = Orchestrator._terminal(tracked, killed, output)
    assert isinstance(end, ActivationCompleted)
    assert (end.text, end.reason, end.exit_code) == ("done", "completed", 0)


def test_a_backend_that_knows_another_attempt_is_vain_ends_it_not_retryable() -> None:
    """A pod whose image name is invalid fails the same way every time; one whose pull failed
    may pass next time; an exit that says nothing is retried as before."""
    request = ActivationRequested(activation_id=new_id(), agent_id=new_id(), signal_ids=())
    tracked = Tracked(new_id(), request)
    ends = [
        Orchestrator._terminal(tracked, Exit(None, "lost", "x", retryable=r), None)
        for r in (False, True, None)
    ]
    assert [getattr(e, "retryable", None) for e in ends] == [False, True, True]


def terminals(types: list[str]) -> list[str]:
    return [t for t in types if t in TERMINAL]


async def _exists(path: Path) -> bool:
    return path.exists()


async def test_a_cancel_while_the_backend_cannot_list_ends_the_activation_at_once(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    """Its backend cannot say what runs (an engine down) since the replica took the lead: a
    cancel ends the activation now — not once the backend answers, maybe never — and the
    sandbox the backend shows later is stopped as an orphan."""
    model.script([Reply.text("never in time", delay=90)])
    async with harness(platform, model, tmp_path, process_backend, "process") as h:
        session_id, activation_id = await started_then_left(h, "cancel-unlisted")
    flaky: list[UnreachableAtFirst] = []

    async def unreachable_a_while(settings: OrchestratorSettings) -> Backend:
        flaky.append(UnreachableAtFirst(settings.sandboxes(), failures=4))  # ~15 s of silence
        return flaky[0]

    async with harness(platform, model, tmp_path, unreachable_a_while, "process") as h:
        await eventually(
            lambda: asyncio.sleep(0, flaky[0].listings), bool, what="a listing that failed"
        )
        await platform.store.append_next(
            session_id,
            [ActivationCancelRequested(activation_id=activation_id, reason="stop it")],
            EventMeta(actor="system:scheduler"),
        )
        ended = await h.ended(activation_id, timeout=10)
        assert terminals(ended) == ["activation.cancelled"], ended
        assert flaky[0].listings <= flaky[0].failures  # before the backend answered
        await eventually(
            lambda: asyncio.sleep(0, flaky[0].listings),
            lambda listings: listings > flaky[0].failures,
            timeout=40,
            what="the backend answering",
        )
        await eventually(h.live_ids, lambda ids: activation_id not in ids, what="orphan stopped")


async def test_the_wall_clock_limit_ends_an_activation_whose_backend_cannot_list(
    platform: Stack,
    model: ScriptedModelServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its backend never answers a listing: the activation still ends, timed out, once its
    wall clock (counted from its start in the log) and the stop's grace have passed."""
    model.script([Reply.text("too late", delay=90)])
    async with harness(platform, model, tmp_path, process_backend, "process") as h:
        _, activation_id = await started_then_left(h, "overdue-unlisted", wall_clock=3)
    monkeypatch.setattr(engine, "STOP_GRACE_SECONDS", 1.0)

    async def never_listing(settings: OrchestratorSettings) -> Backend:
        return UnreachableAtFirst(settings.sandboxes(), failures=10**6)

    async with harness(platform, model, tmp_path, never_listing, "process") as h:
        ended = await h.ended(activation_id, timeout=40)
    assert terminals(ended) == ["activation.timed_out"], ended
    timed_out = (await platform.store.load("activation", activation_id)).events[-1].data
    assert isinstance(timed_out, ActivationTimedOut)
    assert timed_out.timeout_seconds == 3


class AnOrphanLater(ProcessBackend):
    """The process backend, showing from its second listing on a sandbox no activation owns —
    as a container left running while this replica led (a launch whose answer was lost, and
    whose removal failed too) — and one finished, kept by its policy; and telling what was
    done with those."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.listings = 0
        self.orphan = Handle(new_id(), "process", "orphan-sandbox")
        self.kept = Handle(new_id(), "process", "kept-sandbox", finished=True)
        self.cancelled: list[str] = []
        self.cleaned: list[tuple[str, bool]] = []

    async def list_live(self) -> list[Handle]:
        self.listings += 1
        live = await super().list_live()
        if self.listings == 1:
            return live
        gone = {sandbox for sandbox, _ in self.cleaned}  # cleaned up, the orphan is gone
        return [*live, *(h for h in (self.orphan, self.kept) if h.sandbox_id not in gone)]

    def _ours(self, handle: Handle) -> bool:
        return handle.sandbox_id in {self.orphan.sandbox_id, self.kept.sandbox_id}

    async def cancel(self, handle: Handle) -> None:
        if self._ours(handle):
            self.cancelled.append(handle.sandbox_id)
            return
        await super().cancel(handle)

    async def cleanup(self, handle: Handle, succeeded: bool) -> None:
        if self._ours(handle):
            self.cleaned.append((handle.sandbox_id, succeeded))
            return
        await super().cleanup(handle, succeeded=succeeded)


async def test_a_sandbox_orphaned_while_a_replica_leads_is_cleared_by_its_sweep(
    platform: Stack,
    model: ScriptedModelServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Orphans were looked for only when a replica took the lead, which may be weeks away:
    the leader's housekeeping round now stops the running ones too — and leaves alone the
    sandbox of an activation it is watching, and a finished one (kept by its policy: the
    takeover goes over those)."""
    monkeypatch.setattr(engine, "SWEEP_SECONDS", 0.3)
    model.script([Reply.text("still thinking", delay=60)])
    made: list[AnOrphanLater] = []

    async def with_an_orphan_later(settings: OrchestratorSettings) -> Backend:
        made.append(AnOrphanLater(settings.sandboxes()))
        return made[0]

    async with harness(platform, model, tmp_path, with_an_orphan_later, "process") as h:
        w = await h.world("sweep")
        activation_id = await h.request(w)
        await h.started(activation_id)
        backend = made[0]
        await eventually(
            lambda: asyncio.sleep(0, backend.cleaned), bool, timeout=20, what="the orphan cleared"
        )
        listed = backend.listings
        await eventually(
            lambda: asyncio.sleep(0, backend.listings), lambda n: n > listed + 1, what="rounds"
        )
        assert backend.cancelled == ["orphan-sandbox"]
        # Its activation is unknown: not completed. The kept one was not touched.
        assert backend.cleaned == [("orphan-sandbox", False)]
        assert activation_id in await h.live_ids()  # the watched one still runs
        assert "activation.started" in await h.story(activation_id)
        assert not set(TERMINAL).intersection(await h.story(activation_id))
