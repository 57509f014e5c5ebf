"""The orchestrator when its own parts fail (process backend, real services; the failures are
injected into the orchestrator's store and backend): an activation still gets exactly one
terminal event when reading or writing the log fails for a while at its end; a cancel that
failed is sent again; a cancel that comes after the runner finished does not undo the work;
and an activation launched by a leader that died before it appended the start keeps its
wall-clock limit and is not launched a second time."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.errors import CommandTimeoutError, InvalidError
from suzumio.contracts.events import (
    ActivationCancelRequested,
    ActivationCompleted,
    ActivationStarted,
    ActivationTimedOut,
    SessionMessageAppended,
)
from suzumio.contracts.ids import new_id
from suzumio.contracts.values import Author
from suzumio.orchestrator.backends.base import Backend, Exit, Handle, LaunchPlan
from suzumio.orchestrator.backends.process import RECORD, ProcessBackend
from suzumio.orchestrator.engine import Tracked, _Seen
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.platform.bus.direct_get import iter_subject
from suzumio.platform.bus.eventstore import (
    HDR_MSG_ID,
    HDR_TYPE,
    HDR_VERSION,
    AggregateStream,
    EventStore,
    types_of,
)
from suzumio.testing.model_server import Reply, ScriptedModelServer
from tests.backend_suite import TERMINAL, Harness, harness
from tests.e2e.stack import Stack
from tests.support import eventually


class FailingStore:
    """The orchestrator's event store, failing its next `loads` reads and `appends` writes of
    an activation once armed (a NATS timeout while a stream elects its leader)."""

    def __init__(self, store: EventStore) -> None:
        self._store = store
        self.loads = 0
        self.appends = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def load(self, aggregate: str, aggregate_id: str) -> AggregateStream:
        if aggregate == "activation" and self.loads > 0:
            self.loads -= 1
            raise TimeoutError("the store did not answer")
        return await self._store.load(aggregate, aggregate_id)

    async def append(self, aggregate_id: str, *args: Any, **kwargs: Any) -> Any:
        if self.appends > 0:
            self.appends -= 1
            raise TimeoutError("the store did not answer")
        return await self._store.append(aggregate_id, *args, **kwargs)


class StartsFail(FailingStore):
    """The store failing the next `starts` appends of `activation.started` (NATS trouble
    while the sandbox was starting), or refusing them all (`refuse`)."""

    starts = 0
    refuse = False

    async def append_next(self, aggregate_id: str, *args: Any, **kwargs: Any) -> Any:
        if any(isinstance(e, ActivationStarted) for e in args[0]):
            if self.refuse:
                raise InvalidError("the event is too large for the bus")
            if self.starts > 0:
                self.starts -= 1
                raise CommandTimeoutError("the store did not confirm the append", subject="")
        return await self._store.append_next(aggregate_id, *args, **kwargs)


class RefusesCompletions(FailingStore):
    """The store refusing every `activation.completed` as invalid (too large for the bus,
    say): a refusal, the same each time it is asked."""

    async def append(self, aggregate_id: str, *args: Any, **kwargs: Any) -> Any:
        if any(isinstance(e, ActivationCompleted) for e in args[0]):
            raise InvalidError("the event is too large for the bus")
        return await super().append(aggregate_id, *args, **kwargs)


class CancelFailsFirst(ProcessBackend):
    """The process backend, its first cancel failing (an engine briefly unreachable)."""

    cancels = 0

    async def cancel(self, handle: Handle) -> None:
        type(self).cancels += 1
        if type(self).cancels == 1:
            raise ConnectionError("the engine is briefly unreachable")
        await super().cancel(handle)


class WatchBreaks(ProcessBackend):
    """The process backend, its watch failing (an engine's event stream broken); it says
    which sandboxes it watched (their process group ids)."""

    watched: list[int] = []  # noqa: RUF012 - one test's record

    async def watch(self, handle: Handle) -> Exit:
        self.watched.append(int(handle.sandbox_id))
        raise RuntimeError("the engine's event stream broke")


class LaunchesThenHangs(ProcessBackend):
    """The process backend, its launch never returning once the sandbox runs: as a leader
    that died between launching and appending the start."""

    async def launch(self, plan: LaunchPlan) -> Handle:
        await super().launch(plan)
        await asyncio.Event().wait()
        raise AssertionError("never")


class Forgetful(ProcessBackend):
    """The process backend, listing no sandbox: as a backend whose record of a finished one
    is gone (a pool worker that acked it long ago)."""

    async def list_live(self) -> list[Handle]:
        return []


def backend_of(cls: type[ProcessBackend]) -> Any:
    async def make(settings: OrchestratorSettings) -> Backend:
        return cls(settings.sandboxes())

    return make


async def story(platform: Stack, activation_id: str) -> list[str]:
    return [
        e.envelope.type for e in (await platform.store.load("activation", activation_id)).events
    ]


def terminals(types: list[str]) -> list[str]:
    return [t for t in types if t in TERMINAL]


async def cancel(platform: Stack, session_id: str, activation_id: str) -> None:
    await platform.store.append_next(
        session_id,
        [ActivationCancelRequested(activation_id=activation_id, reason="asked")],
        EventMeta(actor="system:scheduler"),
    )


async def test_an_end_is_appended_though_the_log_fails_for_a_while(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner finished; reading the activation and writing its end then fail a few times.
    It still ends once, as it did (completed), not failed and not left running."""
    model.script([Reply.text("done despite the store", delay=2)])
    async with harness(platform, model, tmp_path, backend_of(ProcessBackend), "process") as h:
        failing = FailingStore(h.orchestrator._store)
        monkeypatch.setattr(h.orchestrator, "_store", failing)
        w = await h.world("flaky")
        activation_id = await h.request(w)
        await h.started(activation_id)
        failing.loads, failing.appends = 3, 1  # the watch's read, the end's reads and write
        ended = await h.ended(activation_id, timeout=45)
    assert (failing.loads, failing.appends) == (0, 0)
    assert terminals(ended) == ["activation.completed"], ended


@pytest.mark.parametrize("trouble", ["passes", "refused"])
async def test_a_start_the_log_does_not_take_leaves_the_sandbox_at_work(
    platform: Stack,
    model: ScriptedModelServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    trouble: str,
) -> None:
    """The sandbox is running when its start is recorded, and its runner may have acted: NATS
    trouble then (or a refusal) must not stop it and fail the activation, for its work would
    be done again. Trouble that passes: the start is recorded late. A refusal: left out."""
    model.script([Reply.text("done though the start was not", delay=1)])
    async with harness(platform, model, tmp_path, backend_of(ProcessBackend), "process") as h:
        failing = StartsFail(h.orchestrator._store)
        failing.starts, failing.refuse = 2, trouble == "refused"
        monkeypatch.setattr(h.orchestrator, "_store", failing)
        w = await h.world(f"unstarted-{trouble}")
        activation_id = await h.request(w)
        ended = await h.ended(activation_id, timeout=60)
    assert terminals(ended) == ["activation.completed"], ended
    types = await story(platform, activation_id)
    assert ("activation.started" in types) is (trouble == "passes"), types
    assert model.completion_requests  # one run, at work all along


async def test_a_message_that_is_no_commit_of_events_does_not_stop_the_orchestrator(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    """Not JSON at all (a foreign writer, a bug), under a type the orchestrator folds: said in
    the log and passed over. Before, the fold loop died with it, and each restart, replaying
    the log, died there again."""
    model.script([Reply.text("after the garbage")])
    async with harness(platform, model, tmp_path, backend_of(ProcessBackend), "process") as h:
        subject = platform.topology.event_subject("session", new_id())  # a session nobody reads
        headers = {"Suzumio-Type": "session.activation_requested", "Suzumio-Version": "1"}
        await platform.nc.jetstream().publish(subject, b"\x00 not events", headers=headers)
        w = await h.world("after-garbage")
        activation_id = await h.request(w)
        ended = await h.ended(activation_id, timeout=60)
        assert h.orchestrator.leading
    assert terminals(ended) == ["activation.completed"], ended


async def test_an_error_while_watching_stops_the_sandbox_before_the_failure(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    """The activation fails (the scheduler may retry it): its sandbox must not go on at work
    beside the retry."""
    model.script([Reply.text("still at work", delay=120)])
    async with harness(platform, model, tmp_path, backend_of(WatchBreaks), "process") as h:
        w = await h.world("broken")
        activation_id = await h.request(w)
        ended = await h.ended(activation_id, timeout=30)
        assert terminals(ended) == ["activation.failed"], ended
    [group] = WatchBreaks.watched
    await eventually(lambda: asyncio.sleep(0, _gone(group)), bool, what="its processes stopped")


def _gone(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return True
    return False


async def test_an_end_the_store_refuses_is_not_asked_again_but_ends_failed(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only trouble is waited out: a refusal would come every time, so the activation ends
    failed (saying why) instead of being held for ever."""
    model.script([Reply.text("an answer the store will not take")])
    async with harness(platform, model, tmp_path, backend_of(ProcessBackend), "process") as h:
        monkeypatch.setattr(h.orchestrator, "_store", RefusesCompletions(h.orchestrator._store))
        w = await h.world("refused")
        activation_id = await h.request(w)
        ended = await h.ended(activation_id, timeout=30)
    assert terminals(ended) == ["activation.failed"], ended
    failed = (await platform.store.load("activation", activation_id)).events[-1].data
    assert "too large for the bus" in failed.reason  # type: ignore[attr-defined]


async def test_a_cancel_that_failed_is_sent_again(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    model.script([Reply.text("never in time", delay=120)])
    async with harness(platform, model, tmp_path, backend_of(CancelFailsFirst), "process") as h:
        w = await h.world("recancel")
        activation_id = await h.request(w)
        await h.started(activation_id)
        await cancel(platform, w.session_id, activation_id)
        ended = await h.ended(activation_id, timeout=30)  # its limit is 600 s
        assert CancelFailsFirst.cancels >= 2
        assert terminals(ended) == ["activation.cancelled"], ended


async def test_a_cancel_after_the_runner_finished_leaves_it_completed(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    """The cancel is folded after the runner recorded its output and exited, before the end
    is decided: its work is done, and is not to be done again (the scheduler reads a
    cancelled one as to be run again)."""
    model.script([Reply.text("finished first")])
    holder: list[Harness] = []
    session: list[str] = []

    class CancelledOnTheWayOut(ProcessBackend):
        async def watch(self, handle: Handle) -> Exit:
            exit_ = await super().watch(handle)
            await cancel(platform, session[0], handle.activation_id)
            orchestrator = holder[0].orchestrator
            await eventually(
                lambda: asyncio.sleep(0, orchestrator.activations[handle.activation_id]),
                lambda tracked: tracked.cancel_reason is not None,
                what="the cancel folded",
            )
            return exit_

    async with harness(platform, model, tmp_path, backend_of(CancelledOnTheWayOut), "process") as h:
        holder.append(h)
        w = await h.world("late")
        session.append(w.session_id)
        activation_id = await h.request(w)
        ended = await h.ended(activation_id, timeout=45)
    assert terminals(ended) == ["activation.completed"], ended


async def test_a_sandbox_whose_start_was_never_appended_keeps_its_wall_clock_limit(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    """Its leader died between launching it and appending its start: the replica that finds
    it counts the limit from then (later than it should, never unbounded)."""
    model.script([Reply.text("too late", delay=120)])
    async with harness(platform, model, tmp_path, backend_of(LaunchesThenHangs), "process") as h:
        w = await h.world("nostart", wall_clock=6)
        activation_id = await h.request(w)
        await eventually(
            lambda: asyncio.sleep(0, model.completion_requests), bool, what="the runner at work"
        )
    assert await story(platform, activation_id) == []
    async with harness(platform, model, tmp_path, backend_of(ProcessBackend), "process") as h:
        ended = await h.ended(activation_id, timeout=40)
        assert terminals(ended) == ["activation.timed_out"], ended
        timed_out = (await platform.store.load("activation", activation_id)).events[-1].data
        assert isinstance(timed_out, ActivationTimedOut)
        assert timed_out.timeout_seconds == 6


async def test_a_run_whose_start_was_never_appended_is_not_launched_again(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    """Its leader died between launching it and appending its start; it finished, and its
    sandbox is gone from the backend's list: it ends as its recorded output says, and no
    second runner does the work again."""
    model.script([Reply.text("done once")])
    async with harness(platform, model, tmp_path, backend_of(LaunchesThenHangs), "process") as h:
        w = await h.world("once")
        activation_id = await h.request(w)
        await eventually(
            lambda: story(platform, activation_id),
            lambda types: "activation.output_recorded" in types,
            timeout=30,
            what="the output",
        )
        host_dir = h.orchestrator._planner.settings.activation_dir(activation_id)
        await eventually(
            lambda: asyncio.sleep(0, (host_dir / "exit_code").exists()), bool, what="the exit"
        )
    (host_dir / RECORD).unlink(missing_ok=True)
    async with harness(platform, model, tmp_path, backend_of(Forgetful), "process") as h:
        ended = await h.ended(activation_id, timeout=30)
    assert terminals(ended) == ["activation.completed"], ended
    assert "activation.started" not in ended
    assert len(model.completion_requests) == 1  # the work was done once


class CountingStore(FailingStore):
    """The orchestrator's event store, counting its reads of activations' subjects."""

    async def load(self, aggregate: str, aggregate_id: str) -> AggregateStream:
        if aggregate == "activation":
            self.reads = getattr(self, "reads", 0) + 1
        return await super().load(aggregate, aggregate_id)


async def test_an_end_goes_by_the_folded_log_without_reading_it(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner's output was folded long before its sandbox exited: the end is decided and
    appended from the fold, with the output's text, and the activation's subject is not
    read (a round trip to the log per activation)."""
    model.script([Reply.text("from the fold")])
    async with harness(platform, model, tmp_path, backend_of(ProcessBackend), "process") as h:
        counting = CountingStore(h.orchestrator._store)
        monkeypatch.setattr(h.orchestrator, "_store", counting)
        w = await h.world("folded")
        activation_id = await h.request(w)
        ended = await h.ended(activation_id, timeout=30)
    assert terminals(ended) == ["activation.completed"], ended
    end = (await platform.store.load("activation", activation_id)).events[-1].data
    assert isinstance(end, ActivationCompleted)
    assert end.text == "from the fold"
    assert getattr(counting, "reads", 0) == 0


async def test_an_end_decided_from_a_fold_that_missed_the_output_is_decided_again(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fold lags: it has the start but not the output. The end appended on its version
    loses to the output; the subject is read and the activation ends completed with the
    output's text (not failed for want of one)."""
    model.script([Reply.text("recorded after the fold")])
    stale: list[int] = []

    def lagging(tracked: Tracked) -> Any:
        stale.append(tracked.version)
        return _Seen(version=1, output=None, folded=True)

    async with harness(platform, model, tmp_path, backend_of(ProcessBackend), "process") as h:
        monkeypatch.setattr(h.orchestrator, "_as_folded", lagging)
        w = await h.world("lagging")
        activation_id = await h.request(w)
        ended = await h.ended(activation_id, timeout=30)
    assert stale
    assert stale[0] >= 2  # the real fold had the output on top of the start
    assert terminals(ended) == ["activation.completed"], ended
    end = (await platform.store.load("activation", activation_id)).events[-1].data
    assert isinstance(end, ActivationCompleted)
    assert end.text == "recorded after the fold"


async def test_one_activation_whose_log_cannot_be_read_holds_up_no_other_at_reconciling(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs whose leader died before appending their starts; both finished and are gone
    from the backend. The new leader cannot read the first one's subject (an event of a
    newer release on it, say): the second still ends as its output says, and the leader
    keeps leading."""
    model.script([Reply.text("first"), Reply.text("second")])
    async with harness(platform, model, tmp_path, backend_of(LaunchesThenHangs), "process") as h:
        # Two sessions: a session's next activation fences its last one (it writes no more).
        ids = [await h.request(await h.world(name)) for name in ("isolated", "isolated-2")]
        for activation_id in ids:
            await eventually(
                lambda a=activation_id: story(platform, a),  # type: ignore[misc]
                lambda types: "activation.output_recorded" in types,
                timeout=30,
                what="the output",
            )
            exit_file = h.orchestrator._planner.settings.activation_dir(activation_id) / "exit_code"
            await eventually(
                lambda f=exit_file: asyncio.sleep(0, f.exists()),  # type: ignore[misc]
                bool,
                what="the exit",
            )
    unreadable, readable = ids
    load = EventStore.load

    async def refusing(self: EventStore, aggregate: str, aggregate_id: str, **kw: Any) -> Any:
        if aggregate == "activation" and aggregate_id == unreadable:
            raise ValueError("an event this release cannot read")
        return await load(self, aggregate, aggregate_id, **kw)

    monkeypatch.setattr(EventStore, "load", refusing)
    async with harness(platform, model, tmp_path, backend_of(Forgetful), "process") as h:
        ended = await h.ended(readable, timeout=30)
        assert h.orchestrator.leading
    monkeypatch.undo()
    assert terminals(ended) == ["activation.completed"], ended
    assert terminals(await story(platform, unreadable)) == []


END_FAILED = "orchestrator.end_failed"


async def test_an_end_is_not_decided_over_an_event_this_release_cannot_read(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    """A newer release stored an event of a type this one does not know on the activation's
    subject (a new way to end, say). The fold cannot stand for the subject, and reading it
    fails: the activation is left for a release that can read it, not ended over it."""
    model.script([Reply.text("after the stranger", delay=2)])
    async with harness(platform, model, tmp_path, backend_of(ProcessBackend), "process") as h:
        w = await h.world("stranger")
        activation_id = await h.request(w)
        await h.started(activation_id)
        head = await platform.store.head("activation", activation_id)
        envelope = {
            "id": new_id(), "type": "activation.from_the_future", "aggregate": "activation",
            "aggregate_id": activation_id, "version": head.version + 1,
            "occurred_at": "2030-01-01T00:00:00Z", "actor": "system:future",
            "correlation_id": "c", "schema": 1, "data": {},
        }  # fmt: skip
        with capture_logs() as logs:
            await platform.nc.jetstream().publish(
                platform.topology.event_subject("activation", activation_id),
                json.dumps(envelope).encode(),
                headers={
                    HDR_MSG_ID: str(envelope["id"]),
                    HDR_TYPE: str(envelope["type"]),
                    HDR_VERSION: str(head.version + 1),
                },
            )
            await eventually(
                lambda: asyncio.sleep(
                    0, [e for e in logs if e["event"] == "orchestrator.end_failed"]
                ),
                bool,
                timeout=30,
                what="the end given up for now",
            )
    assert [t for t in await stored_types(platform, activation_id) if t in TERMINAL] == []


async def stored_types(platform: Stack, activation_id: str) -> list[str]:
    """The event types on an activation's subject, as stored (this release cannot decode
    them all)."""
    subject = platform.topology.event_subject("activation", activation_id)
    stream = platform.topology.events_stream
    return [
        t
        async for stored in iter_subject(platform.nc, stream, subject)
        for t in types_of(stored.headers) or ()
    ]


async def test_a_session_closed_before_its_last_entries_still_has_its_directory_let_go(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    """A closed session still takes its last activation's history entries, so its closing
    need not be the last event of its log: the retention sweep lets its directory go all the
    same (it stayed for good), and keeps a reopened session's."""
    async with harness(platform, model, tmp_path, backend_of(ProcessBackend), "process") as h:
        closed, reopened = await h.world("closed-then-written"), await h.world("reopened")
        for w in (closed, reopened):
            async with platform.client(w.key) as c:
                answer = await c.post(f"/v1/sessions/{w.session_id}/close", json={})
                assert answer.status_code == 200, answer.text
        async with platform.client(reopened.key) as c:
            answer = await c.post(f"/v1/sessions/{reopened.session_id}/reopen", json={})
            assert answer.status_code == 200, answer.text
        for w in (closed, reopened):  # then an entry of its last activation
            entry = SessionMessageAppended(
                message_id=new_id(),
                author=Author(kind="agent", id=w.agent_id),
                role="assistant",
                text="the last words",
                activation_id=new_id(),
            )
            await platform.store.append_next(w.session_id, [entry], EventMeta(actor="test"))
        # And last, an event the sessions read model does not take (its row's version stays
        # behind the log's for good: the directory stayed when that was compared).
        cancel = ActivationCancelRequested(activation_id=new_id(), reason="stopped")
        await platform.store.append_next(closed.session_id, [cancel], EventMeta(actor="test"))
        root = h.orchestrator._planner.settings.sandboxes() / "sessions"
        for w in (closed, reopened):
            (root / w.session_id / "workspace").mkdir(parents=True)
            os.utime(root / w.session_id, (1, 1))  # untouched for ages
        await eventually(  # the read model has the closing
            lambda: h.orchestrator._closed_at(closed.session_id),
            lambda at: at is not None,
            what="the closing in the read model",
        )
        await h.orchestrator._collect_garbage(time.time() + 60)
        assert not (root / closed.session_id).exists()
        assert (root / reopened.session_id).exists()
        # The read model counts only once it stands at the log's last event: behind it (a
        # reopening it has not shown yet, say) it does not say closed.
        head = await platform.store.head("session", closed.session_id)
        assert await h.orchestrator._artifacts.closed_at(closed.session_id, head.seq)
        later = head.seq + 1_000_000
        assert await h.orchestrator._artifacts.closed_at(closed.session_id, later) is None
