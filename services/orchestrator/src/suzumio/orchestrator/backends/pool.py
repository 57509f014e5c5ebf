"""The pool backend (DESIGN.md §8): activations as dispatches on a work queue,
run by long-lived workers (`python -m suzumio.runner worker`) on as many hosts as wanted.

`launch` publishes an `ActivationDispatch` to `act.<pool>` (stream ACTIVATIONS, work-queue
retention) with `Nats-Msg-Id` = the dispatch id (`<activation>.<attempt>`), so a retried
launch is one dispatch. The dispatch carries the sandbox's environment — provider keys — and
the input's token: they stay inside the platform's NATS (only services and workers may reach
`act.>`; use TLS and accounts between hosts), leave the stream when the worker acks, and are
never logged here or by the worker.

Workers answer on core NATS (`Topology.pool_*`): `pool.status.<activation>` carries `started`,
`heartbeat` and `exited` (or `refused`); `pool.worker.<id>` their presence; `pool.list` what they
run. `watch` waits for the end; after `started`, heartbeats missing for
`heartbeat_timeout_seconds` — and no worker claiming the dispatch when asked — is
`Exit(None, "lost")`, and the dispatch is then deleted from the queue and cancelled on every
worker, so that attempt never runs again (`ack_wait_seconds` must outlast the heartbeat timeout,
so the queue does not hand it to another worker first). `cancel` does the same.

What a pool sandbox does not have: the orchestrator's disk. Host mounts are refused unless
`allow_mounts` says the workers see the same paths; files copied into `host_dir` and left in
`workspace/out/` stay on the side they were written. With `session_affinity` the dispatch names
its session, and a worker that ran the session's last activation within its idle TTL runs the
next one in the same workspace (warm sessions; see `suzumio.runner.worker`): such a dispatch is
sent to `act.<pool>.worker.<id>`, the worker keeping the session warm, while that worker is
alive, takes routed dispatches and has a slot free; one stranded there by the worker's death is
lost once its beats stopped (docs/pool.md, session affinity). A worker that cannot start one
sent to it within a few seconds hands it back (`refused`, `busy`), and it goes to the pool's
queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from suzumio.contracts.runner import (
    ActivationDispatch,
    PoolCancel,
    PoolListRequest,
    PoolStatus,
    PoolWorkerInfo,
)
from suzumio.contracts.subjects import Topology
from suzumio.contracts.values import Slug
from suzumio.orchestrator.backends.base import Exit, Handle, Health, LaunchError, LaunchPlan
from suzumio.platform.bus.replies import Replies
from suzumio.platform.logging import get_logger

log = get_logger(__name__)

# The message is gone: deleted or acked (10057), or below the stream's first sequence once
# everything before it left too (10043, "sequence N not found" — the usual case by the time
# an activation ends).
NOT_THERE = frozenset({10057, 10043})
CLEANED_SECONDS = 900.0  # longer than a worker names its recent exits (600 s)
MAX_WARM_ROUTES = 100_000  # sessions whose warm worker is remembered (the oldest go first)
QUEUE_ATTEMPTS = 3  # a dispatch's publish, when its answer does not come


class PoolSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    default_pool: Slug = Field(default="default", description="for profiles that name none")
    pools: tuple[Slug, ...] = Field(default=("default",), description="pools `health` requires")
    heartbeat_timeout_seconds: float = Field(default=15.0, gt=0)
    ack_wait_seconds: float = Field(default=30.0, gt=0, description="the pool consumer's")
    max_deliver: int = Field(default=5, ge=1)
    max_ack_pending: int = Field(default=10_000, ge=1, description="in flight, pool-wide")
    queue_timeout_seconds: float = Field(
        default=3_600, gt=0, description="added to the wall clock when the plan has no deadline"
    )
    list_timeout_seconds: float = Field(default=0.5, gt=0)
    worker_alive_seconds: float = Field(default=15.0, gt=0)
    request_timeout_seconds: float = Field(default=5.0, gt=0)
    max_listed: int = Field(default=10_000, ge=0, description="queued dispatches list_live reads")
    broker_url: str | None = Field(default=None, description="the broker as workers reach it")
    allow_mounts: bool = Field(
        default=False, description="pass host mounts through (workers share the paths)"
    )
    session_affinity: bool = Field(
        default=True,
        description="let workers keep sessions warm, and send a warm session's dispatches there",
    )

    @model_validator(mode="after")
    def _ack_wait_outlasts_heartbeats(self) -> PoolSettings:
        if self.ack_wait_seconds <= self.heartbeat_timeout_seconds:
            raise ValueError("ack_wait_seconds must exceed heartbeat_timeout_seconds")
        return self


@dataclass
class _Tracker:
    """What the workers said about one dispatch, from launch on."""

    dispatch_id: str
    started: bool
    last_seen: float = field(default_factory=time.monotonic)
    worker_id: str | None = None
    final: PoolStatus | Exit | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    affinity_key: str | None = None
    routed_to: str | None = None  # sent to that worker's own consumer (session affinity)
    seq: int | None = None  # its message in the work queue
    # JetStream handed it out this many times (`max_deliver`) and never will again.
    given_up_after: int = 0
    # The dispatch as sent to a warm worker, kept until a worker starts it: the worker may
    # hand it back (`busy`), and it then goes to the pool's queue.
    body: bytes | None = None

    def update(self, status: PoolStatus) -> bool:
        """Take a worker's word; False when it is not taken: a last word from another worker
        than the one known to run it."""
        final = status.kind in {"exited", "refused"}
        if final and self.started and self.worker_id not in {None, status.worker_id}:
            # A worker that held the dispatch before (cut off past the ack wait while it
            # brought the files in) and came back to find it claimed, or its files failed:
            # taken for the end of the run, it had the healthy run on the other worker
            # cancelled. That run's own worker says how it ends — or, gone, its silence.
            log.warning("pool.stale_word", dispatch=self.dispatch_id, kind=status.kind,
                        reason=status.reason, worker=status.worker_id,
                        running_on=self.worker_id)  # fmt: skip
            return False
        self.last_seen = time.monotonic()
        if final:
            self.final = status
        else:
            self.started = True
            self.worker_id = status.worker_id
        if self.started:
            self.body = None
        self.changed.set()
        return True


_REFUSALS: dict[str, tuple[Literal["timeout", "cancelled"], str]] = {
    "deadline": ("timeout", "the deadline passed before a worker started it"),
    "cancelled": ("cancelled", "cancelled before it started"),
}


def exit_of(status: PoolStatus) -> Exit:
    """How a worker's last word reads as the backend's `Exit`."""
    if status.kind == "refused":
        return _refused(status)
    code, detail = status.exit_code, status.detail
    if status.reason == "oom":
        return Exit(
            code, "oom", detail or "the runner was killed at its memory limit", status.outputs
        )
    if status.reason in {"exited", "timeout"}:
        reason: Literal["timeout", "exited"] = "timeout" if status.reason == "timeout" else "exited"
        return Exit(code, reason, detail, status.outputs)
    if status.reason == "spawn_failed":
        return Exit(None, "lost", f"worker {status.worker_id} could not start it: {detail}")
    why = status.reason if status.reason in {"cancelled", "shutdown"} else f"signal {status.signal}"
    return Exit(code, "killed", f"{why}; {detail}" if detail else why, status.outputs)


def _refused(status: PoolStatus) -> Exit:
    if status.reason in _REFUSALS:
        return Exit(None, *_REFUSALS[status.reason])
    if status.reason == "busy":
        detail = f"worker {status.worker_id}, which the dispatch was sent to, had no slot"
        return Exit(None, "lost", detail)
    if status.reason == "claimed":
        # Handed out again after a worker started it (that worker gone without a word): its
        # run's end is unknown, and it is never run twice.
        detail = f"worker {status.worker_id} found it started already by a worker since gone"
        return Exit(None, "lost", detail)
    return Exit(None, "lost", f"worker {status.worker_id} could not read the dispatch")


class PoolBackend:
    name = "pool"

    def __init__(self, nc: NATS, topology: Topology, settings: PoolSettings | None = None) -> None:
        self._nc = nc
        self._js = nc.jetstream()
        self.topology = topology
        self.settings = settings or PoolSettings()
        self._trackers: dict[str, _Tracker] = {}
        self._cleaned: dict[str, float] = {}  # dispatch → when: in order of cleanup
        # Runs of those heard of again, and when they were last told to stop (see `_stop_again`);
        # forgotten with the dispatch's cleanup.
        self._stopped_again: dict[str, float] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._statuses: Subscription | None = None
        self._given_up: Subscription | None = None
        self._statuses_made = asyncio.Lock()
        self._consumers: set[str] = set()
        self._workers: dict[str, tuple[float, PoolWorkerInfo]] = {}
        self._presence: Subscription | None = None
        self._presence_since = 0.0
        # The NATS connection as last looked at (`_silence`): its reconnects, and since when
        # it has been up as far as this backend knows.
        self._reconnects = nc.stats["reconnects"]
        self._connected_since = 0.0
        # Affinity key → the worker keeping that session warm, and since when (monotonic):
        # from its `exited` (warm) and its presence beats. In time order, the oldest first.
        self._warm: dict[str, tuple[str, float]] = {}

    # -- launch -----------------------------------------------------------------------------
    async def launch(self, plan: LaunchPlan) -> Handle:
        if plan.mounts and not self.settings.allow_mounts:
            raise LaunchError("the pool backend cannot mount host directories", retryable=False)
        dispatch = self._dispatch(plan)
        did = dispatch.dispatch_id
        body = dispatch.model_dump_json().encode()
        if len(body) + 256 > self._nc.max_payload:  # room for the headers
            # The same plan would be as large on every attempt: retrying cannot help.
            raise LaunchError(
                f"the dispatch is {len(body)} bytes; the pool's queue takes messages of at most "
                f"{self._nc.max_payload} bytes (the NATS server's max_payload) — compact the "
                "session's history or raise max_payload",
                retryable=False,
            )
        try:
            await self._ensure_consumer(dispatch.pool)
            tracker = await self._track(did, started=False)
            if dispatch.affinity_key is not None:
                await self._ensure_presence()
                tracker.affinity_key = dispatch.affinity_key
                if tracker.routed_to is None:  # a launch retried goes where the first went
                    tracker.routed_to = self._warm_worker(dispatch.affinity_key, dispatch.pool)
                if tracker.routed_to is not None and not tracker.started:
                    tracker.body = body
            subject = (
                self.topology.worker_activation_subject(dispatch.pool, tracker.routed_to)
                if tracker.routed_to is not None
                else self.topology.activation_subject(dispatch.pool)
            )
            ack = await self._queue(subject, did, body)
        except (NatsError, TimeoutError, ValueError) as exc:
            self._untrack(did)
            # It may be queued all the same (only its answer was lost): no worker may start it
            # now that this attempt fails — they refuse a dispatch they heard cancelled.
            await self._withdraw(Handle(plan.activation_id, self.name, did, {}))
            raise LaunchError(f"could not queue dispatch {did}: {type(exc).__name__}") from None
        if "error" in ack:  # the stream refused it (full, say): a later attempt may fit
            self._untrack(did)
            why = ack["error"].get("description", "refused")
            raise LaunchError(f"could not queue dispatch {did}: {why}")
        seq = tracker.seq = int(ack["seq"])
        log.info("pool.dispatched", activation=plan.activation_id, dispatch=did,
                 pool=dispatch.pool, seq=seq, duplicate=bool(ack.get("duplicate")),
                 routed_to=tracker.routed_to)  # fmt: skip
        data = {"pool": dispatch.pool, "attempt": dispatch.attempt, "seq": seq,
                "deadline": dispatch.deadline.timestamp(), "state": "queued",
                "routed_to": tracker.routed_to}  # fmt: skip
        return Handle(plan.activation_id, self.name, did, data)

    def _warm_worker(self, key: str, pool: str) -> str | None:
        """The worker of `pool` keeping the session `key` warm, if it is alive (a beat within
        `worker_alive_seconds`), takes routed dispatches, and has a slot free by this
        orchestrator's count (what it runs and what was sent to it and not yet started) —
        else None: the pool's queue, where any worker takes it."""
        found = self._warm.get(key)
        if found is None:
            return None
        worker_id, _ = found
        beat = self._workers.get(worker_id)
        if beat is None or time.monotonic() - beat[0] > self.settings.worker_alive_seconds:
            return None
        info = beat[1]
        if info.pool != pool or not info.takes_routed:
            return None
        busy = sum(
            1
            for t in self._trackers.values()
            if t.final is None
            and (t.worker_id == worker_id or (not t.started and t.routed_to == worker_id))
        )
        # The dispatch being launched is tracked already, routed nowhere yet: not counted.
        return worker_id if busy < info.capacity else None

    def _keep_warm(self, key: str, worker_id: str, at: float) -> None:
        self._warm.pop(key, None)  # to the end: the dict stays in time order
        self._warm[key] = (worker_id, at)
        if len(self._warm) > MAX_WARM_ROUTES:
            for old in list(self._warm)[: MAX_WARM_ROUTES // 10]:
                del self._warm[old]

    def _silence(self, tracker: _Tracker) -> float:
        """How long nothing was heard of a dispatch — counted only while this orchestrator
        could hear: not while its own NATS connection is away (nothing reaches it then, and
        asking the workers would only queue the question), and from its reconnect after that.
        Else an outage of its own longer than the heartbeat timeout had every running
        dispatch declared lost, and their cancels, buffered, stopped them at the reconnect."""
        now = time.monotonic()
        self._note_connection(now)
        return now - max(tracker.last_seen, self._connected_since)

    def _note_connection(self, now: float) -> None:
        reconnects = self._nc.stats["reconnects"]
        if not self._nc.is_connected or reconnects != self._reconnects:
            self._reconnects, self._connected_since = reconnects, now

    def _gone(self, worker_id: str) -> bool:
        """No beat of that worker within `worker_alive_seconds`, beats having been heard
        that long (an orchestrator just started has not heard any yet)."""
        now, alive = time.monotonic(), self.settings.worker_alive_seconds
        self._note_connection(now)  # beats missed while this side was away say nothing
        if self._presence is None or now - max(self._presence_since, self._connected_since) < alive:
            return False
        beat = self._workers.get(worker_id)
        return beat is None or now - beat[0] > alive

    async def _queue(self, subject: str, did: str, body: bytes) -> dict[str, Any]:
        """The queue's answer to the dispatch, asked again when it does not come: the stream
        keeps it once (`Nats-Msg-Id`, within its duplicate window) and says where it is,
        whether the first answer was lost or the first publish was."""
        for attempt in range(1, QUEUE_ATTEMPTS):
            try:
                return await self._publish(subject, did, body)
            except TimeoutError:
                log.warning("pool.queue_timeout", dispatch=did, attempt=attempt)
        return await self._publish(subject, did, body)

    async def _publish(self, subject: str, did: str, body: bytes) -> dict[str, Any]:
        reply = await Replies.of(self._nc).request(
            subject,
            body,
            {"Nats-Msg-Id": did},
            self.settings.request_timeout_seconds,
        )
        ack: dict[str, Any] = json.loads(reply.data)
        return ack

    def _dispatch(self, plan: LaunchPlan) -> ActivationDispatch:
        spec = plan.input
        if self.settings.broker_url:
            spec = spec.model_copy(update={"controller_url": self.settings.broker_url})
        deadline = plan.deadline or datetime.now(UTC) + timedelta(
            seconds=plan.profile.timeouts.wall_clock_seconds + self.settings.queue_timeout_seconds
        )
        return ActivationDispatch(
            attempt=plan.attempt,
            deadline=deadline,
            input=spec,
            pool=plan.profile.pool or self.settings.default_pool,
            env=dict(plan.env),
            affinity_key=plan.session_id if self.settings.session_affinity else None,
            inputs=plan.inputs,
            max_output_files=plan.max_output_files,
            max_output_bytes=plan.max_output_bytes,
            limits=plan.profile.limits,
            idle_seconds=plan.profile.timeouts.idle_seconds,
        )

    async def _ensure_consumer(self, pool: str) -> None:
        """Create or update the pool's consumer: these settings win over a worker's defaults."""
        if pool in self._consumers:
            return
        config = ConsumerConfig(
            durable_name=self.topology.pool_consumer(pool),
            filter_subject=self.topology.activation_subject(pool),
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.settings.ack_wait_seconds,
            max_deliver=self.settings.max_deliver,
            max_ack_pending=self.settings.max_ack_pending,
            deliver_policy=DeliverPolicy.ALL,
        )
        await self._js.add_consumer(self.topology.activations_stream, config)
        self._consumers.add(pool)

    # -- watch ------------------------------------------------------------------------------
    async def watch(self, handle: Handle) -> Exit:
        did = handle.sandbox_id
        tracker = self._trackers.get(did) or await self._track(
            did, started=handle.data.get("state") != "queued"
        )
        if isinstance(seq := handle.data.get("seq"), int):
            tracker.seq = seq
        running_on = handle.data.get("worker_id")
        if tracker.worker_id is None and handle.data.get("state") == "running":
            # Found running there (a takeover's listing): another worker's last word about it
            # is a stale one, as it is for a dispatch heard started.
            tracker.worker_id = running_on if isinstance(running_on, str) else None
        if tracker.final is None and isinstance(ended := handle.data.get("exit"), dict):
            with contextlib.suppress(ValidationError):  # it ended while no one watched
                tracker.update(PoolStatus.model_validate(ended))
        # Cancelled (the caller's own timeout), the tracker stays: a later watch, after a
        # cancel, still sees what the workers said meanwhile.
        result = await self._until_end(handle, tracker)
        final = tracker.final
        if isinstance(final, PoolStatus) and final.kind == "exited" and final.acked:
            handle.data["left_queue"] = True  # for `cleanup`: no need to take it out
        self._untrack(did)
        return result

    async def _until_end(self, handle: Handle, tracker: _Tracker) -> Exit:
        deadline = handle.data.get("deadline")
        while True:
            tracker.changed.clear()
            if (final := tracker.final) is not None:
                ended = await self._final(handle, tracker, final)
                if ended is None:
                    continue  # handed back and queued again
                return ended
            if tracker.started:
                silent = self._silence(tracker)
                wait = self.settings.heartbeat_timeout_seconds - silent
                if wait <= 0 and not await self._claimed(tracker):
                    # `gone`: its worker died, and the runner with it; if the runner had
                    # recorded its output first, the activation ends as that output says
                    # (else the same work would be done, and answered, again).
                    lost = Exit(None, "lost", _silent(tracker), gone=True)
                    return await self._abandon(handle, lost)
            else:
                if tracker.given_up_after:
                    # Sent back to the queue by worker after worker (each full, or stopping):
                    # the queue hands it out no more, and it would wait for its deadline.
                    detail = (
                        f"the queue handed its dispatch out {tracker.given_up_after} times "
                        "and no worker started it"
                    )
                    return await self._abandon(handle, Exit(None, "lost", detail, gone=True))
                wait = deadline - time.time() if isinstance(deadline, (int, float)) else 60.0
                if wait <= 0:
                    detail = "no worker started it before its deadline"
                    return await self._abandon(handle, Exit(None, "timeout", detail))
                silent = self._silence(tracker)
                if silent >= self.settings.heartbeat_timeout_seconds:
                    # Its `started` (and maybe its `exited`) may have been missed, across a
                    # reconnect or a restart: once it left the queue, some worker took it to
                    # its end, and the workers say which.
                    tracker.last_seen = time.monotonic()
                    if missing := await self._lost_while_queued(handle, tracker):
                        return await self._abandon(handle, missing)
                    continue
                wait = min(wait, self.settings.heartbeat_timeout_seconds - silent)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(tracker.changed.wait(), max(wait, 0.05))

    async def _final(
        self, handle: Handle, tracker: _Tracker, final: PoolStatus | Exit
    ) -> Exit | None:
        """How it ended — None when its worker handed it back and it is queued again."""
        if not _handed_back(final):
            return final if isinstance(final, Exit) else exit_of(final)
        if await self._requeue(handle, tracker):
            return None
        # Its copy may be queued all the same (only the answer was lost): no worker may start
        # it beside the retry.
        assert isinstance(final, PoolStatus)
        return await self._abandon(handle, exit_of(final))

    async def _requeue(self, handle: Handle, tracker: _Tracker) -> bool:
        """A dispatch its warm worker handed back unstarted (no slot came free in time, or it
        stopped): to the pool's queue, where any worker takes it (a cold start, never wrong).
        False when it cannot be: this orchestrator did not send it (it took over since) and
        has not its body, or the queue refused it — then the attempt is lost (retryable).
        True: look at the tracker again (requeued, or ended otherwise meanwhile)."""
        body, pool, by = tracker.body, handle.data.get("pool"), tracker.final
        if body is None or not isinstance(pool, str) or not isinstance(by, PoolStatus):
            return False
        did = handle.sandbox_id
        try:
            # Another message id: the routed one's is still in the duplicate window.
            ack = await self._queue(self.topology.activation_subject(pool), f"{did}.pool", body)
        except (NatsError, TimeoutError):
            return False
        if "error" in ack:
            return False
        if tracker.final is not by:  # cancelled meanwhile: the copy must not run either
            with contextlib.suppress(NatsError, TimeoutError):
                await self._js.delete_msg(self.topology.activations_stream, int(ack["seq"]))
            return True
        tracker.seq = handle.data["seq"] = int(ack["seq"])
        tracker.routed_to = handle.data["routed_to"] = None
        tracker.final, tracker.body = None, None
        tracker.last_seen = time.monotonic()
        log.info("pool.requeued", activation=handle.activation_id, dispatch=did,
                 seq=tracker.seq, handed_back_by=by.worker_id)  # fmt: skip
        return True

    async def _lost_while_queued(self, handle: Handle, tracker: _Tracker) -> Exit | None:
        """A dispatch not heard of for a heartbeat timeout since it was queued: lost if it
        left the queue and no worker claims it, or if the worker it was sent to (session
        affinity) is gone — only that worker would ever take it."""
        if not await self._queued_still(handle):
            if not await self._claimed(tracker):
                detail = "its dispatch left the queue and no worker claims it"
                return Exit(None, "lost", detail, gone=True)
            return None
        routed = handle.data.get("routed_to")
        if isinstance(routed, str) and self._gone(routed) and not await self._claimed(tracker):
            detail = f"worker {routed}, which its dispatch was sent to, is gone"
            return Exit(None, "lost", detail, gone=True)
        return None

    async def _claimed(self, tracker: _Tracker) -> bool:
        """Heartbeats stopped: ask the workers before declaring it lost (a core NATS message
        may have been missed across a reconnect). Heard of while they were asked — its
        worker back from an outage, its buffered heartbeats or end flushed before its
        subscription to the question is back — it is not lost either: killed for that, a
        healthy run was done again, and an end's outputs were never recorded."""
        seen = tracker.last_seen  # each word taken moves it
        for info in await self._ask_workers(tracker.dispatch_id):
            for status in info.exited:
                if status.dispatch_id == tracker.dispatch_id and tracker.update(status):
                    return True
            for status in info.running:
                if status.dispatch_id == tracker.dispatch_id:
                    tracker.update(status)  # its `started`: alive, and on that worker
                    return True
        return tracker.last_seen != seen

    async def _queued_still(self, handle: Handle) -> bool:
        """Whether its message is still in the work queue (waiting, or held unacked by a
        worker); a worker lists a run's end from before it acks. Unknown counts as still."""
        seq = handle.data.get("seq")
        if not isinstance(seq, int):
            return True
        try:
            await self._js.get_msg(self.topology.activations_stream, seq, direct=True)
        except NotFoundError:
            return False
        except (NatsError, TimeoutError):
            return True
        return True

    async def _abandon(self, handle: Handle, result: Exit) -> Exit:
        log.warning("pool.abandoned", activation=handle.activation_id,
                    dispatch=handle.sandbox_id, reason=result.reason)  # fmt: skip
        await self._withdraw(handle)
        return result

    # -- cancel, cleanup --------------------------------------------------------------------
    async def cancel(self, handle: Handle) -> None:
        """Take the dispatch out of the queue and stop it on whichever worker runs it."""
        await self._withdraw(handle)
        tracker = self._trackers.get(handle.sandbox_id)
        if tracker is None or tracker.started:
            return
        if tracker.final is None or _handed_back(tracker.final):  # not to be queued again
            tracker.final = Exit(None, "cancelled", "cancelled before a worker started it")
            tracker.changed.set()

    async def _withdraw(self, handle: Handle) -> None:
        await self._broadcast_cancel(handle)
        await self._unqueue(handle)

    async def _broadcast_cancel(self, handle: Handle) -> None:
        body = PoolCancel(dispatch_id=handle.sandbox_id).model_dump_json().encode()
        with contextlib.suppress(NatsError, TimeoutError):
            await self._nc.publish(self.topology.pool_cancel_subject(handle.activation_id), body)
            await self._nc.flush(timeout=int(self.settings.request_timeout_seconds) or 1)

    async def _unqueue(self, handle: Handle) -> bool | None:
        """Delete its message from the work queue: whether one was there (None: unknown)."""
        seq = handle.data.get("seq")
        if not isinstance(seq, int):
            return None
        try:
            await self._js.delete_msg(self.topology.activations_stream, seq)
        except NatsError as exc:
            if getattr(exc, "err_code", None) in NOT_THERE:
                return False
            log.warning("pool.withdraw_failed", dispatch=handle.sandbox_id, error=str(exc))
            return None
        except TimeoutError:
            return None
        return True

    async def cleanup(self, handle: Handle, succeeded: bool) -> None:  # noqa: ARG002
        # Workers remove a run's directory when it ends (or keep the session's workspace warm
        # for their idle TTL); nothing of it is left on this side but the subscription — and
        # the workers' word on its exit, which list_live no longer shows, as a removed
        # container is gone from the docker backend's list.
        # A worker acks its dispatch before it reports the end, and says whether the server
        # confirmed the ack: then its message left the queue (`watch` notes it). One whose
        # ack was not confirmed may still be there (as may one whose end came otherwise, from
        # a listing), and the queue would hand the ended attempt to another worker once the
        # ack wait passed — its runner calling the model, paid, before the broker fences it.
        # Taken out, and if it was there (or nobody knows), cancelled on every worker in case
        # one took it since.
        if handle.data.get("left_queue") is not True and await self._unqueue(handle) is not False:
            await self._broadcast_cancel(handle)
        self._untrack(handle.sandbox_id)
        now = time.monotonic()
        self._cleaned.pop(handle.sandbox_id, None)  # to the end: the dict stays in time order
        self._cleaned[handle.sandbox_id] = now
        horizon = now - CLEANED_SECONDS
        while self._cleaned and next(iter(self._cleaned.values())) < horizon:
            gone = next(iter(self._cleaned))
            del self._cleaned[gone]
            self._stopped_again.pop(gone, None)

    # -- list_live, health ------------------------------------------------------------------
    async def list_live(self) -> list[Handle]:
        """What the workers run or ended lately (asked on `pool.list`) and what still waits
        in the queue. An attempt that ended while no orchestrator led is found with its exit,
        so it ends as it did rather than as lost (its dispatch already left the queue)."""
        handles: dict[str, Handle] = {}
        infos = await self._ask_workers()
        for info in infos:
            for status in info.running:
                handles[status.dispatch_id] = Handle(
                    status.activation_id,
                    self.name,
                    status.dispatch_id,
                    {
                        "pool": status.pool,
                        "attempt": status.attempt,
                        "state": "running",
                        "worker_id": info.worker_id,
                        "deadline": status.deadline.timestamp() if status.deadline else None,
                    },
                )
        for info in infos:
            for status in info.exited:
                if status.dispatch_id in self._cleaned:
                    continue
                handles.setdefault(
                    status.dispatch_id,
                    Handle(
                        status.activation_id,
                        self.name,
                        status.dispatch_id,
                        {
                            "pool": status.pool,
                            "attempt": status.attempt,
                            "state": "exited",
                            "worker_id": info.worker_id,
                            "exit": status.model_dump(mode="json"),
                        },
                        ended=True,
                    ),
                )
        for handle in await self._queued():
            known = handles.get(handle.sandbox_id)
            if known is None:
                handles[handle.sandbox_id] = handle
            else:
                # Unacked while it runs, or after its exit (the worker's word on it counts):
                # where its message is, so that cleanup can still take it out of the queue.
                known.data["seq"] = handle.data["seq"]
        return list(handles.values())

    async def _queued(self) -> list[Handle]:
        found: list[Handle] = []
        seq = 1
        while len(found) < self.settings.max_listed:
            try:
                raw = await self._js.get_msg(
                    self.topology.activations_stream,
                    seq=seq,
                    subject=self.topology.activations_filter(),
                    next=True,
                    direct=True,
                )
            except NotFoundError:
                break
            seq = (raw.seq or seq) + 1
            try:
                d = ActivationDispatch.model_validate_json(raw.data or b"")
            except ValidationError:
                continue
            subject = raw.subject or self.topology.activation_subject(d.pool)
            routed = subject != self.topology.activation_subject(d.pool)
            data = {"pool": d.pool, "attempt": d.attempt, "seq": raw.seq,
                    "deadline": d.deadline.timestamp(), "state": "queued",
                    "routed_to": subject.rsplit(".", 1)[-1] if routed else None}  # fmt: skip
            found.append(Handle(d.input.activation.id, self.name, d.dispatch_id, data))
        return found

    async def health(self) -> Health:
        await self._ensure_presence()
        if time.monotonic() - self._presence_since < self.settings.worker_alive_seconds:
            for info in await self._ask_workers():  # just subscribed: no beat seen yet
                self._workers[info.worker_id] = (time.monotonic(), info)
        horizon = time.monotonic() - self.settings.worker_alive_seconds
        # A worker's id is new with each of its processes: the gone ones are forgotten.
        self._workers = {k: v for k, v in self._workers.items() if v[0] >= horizon}
        alive = [info for _, info in self._workers.values()]
        pools: dict[str, dict[str, Any]] = {}
        try:
            for pool in sorted({*self.settings.pools, *(i.pool for i in alive)}):
                mine = [i for i in alive if i.pool == pool]
                pools[pool] = {
                    "workers": sorted(i.worker_id for i in mine),
                    "capacity": sum(i.capacity for i in mine),
                    "running": sum(len(i.running) for i in mine),
                    **await self._depth(pool, [i.worker_id for i in mine if i.takes_routed]),
                }
        except (NatsError, TimeoutError) as exc:
            return Health(ok=False, detail={"error": f"jetstream: {type(exc).__name__}"})
        ok = all(pools[p]["workers"] for p in self.settings.pools)
        return Health(ok=ok, detail={"pools": pools})

    async def _depth(self, pool: str, routable: list[str]) -> dict[str, int]:
        """Dispatches waiting for a worker (`pending`) and held by one (`in_flight`): the
        pool's queue's, and those sent to each of the `routable` workers' own consumer."""
        try:
            info = await self._js.consumer_info(
                self.topology.activations_stream, self.topology.pool_consumer(pool)
            )
        except NotFoundError:
            stream = await self._js.stream_info(
                self.topology.activations_stream,
                subjects_filter=self.topology.activation_subject(pool),
            )
            return {"pending": sum((stream.state.subjects or {}).values()), "in_flight": 0}
        pending, in_flight = info.num_pending or 0, info.num_ack_pending or 0
        for worker_id in routable:
            with contextlib.suppress(NotFoundError):
                own = await self._js.consumer_info(
                    self.topology.activations_stream,
                    self.topology.worker_consumer(pool, worker_id),
                )
                pending += own.num_pending or 0
                in_flight += own.num_ack_pending or 0
        return {"pending": pending, "in_flight": in_flight}

    async def close(self) -> None:
        await self.release()

    async def release(self) -> None:
        # What it kept was for watching, which the next leader does now: the dispatches
        # (those still routed to a warm worker with their body, and so their token) and the
        # subscriptions to every worker's word.
        self._trackers.clear()
        for sub in (self._statuses, self._given_up, self._presence):
            if sub is not None:
                with contextlib.suppress(NatsError):
                    await sub.unsubscribe()
        self._statuses = self._given_up = self._presence = None
        if self._stopping:  # short (a publish and its flush): let them go out
            await asyncio.wait(set(self._stopping), timeout=5)

    # -- subscriptions ----------------------------------------------------------------------
    async def _track(self, did: str, *, started: bool) -> _Tracker:
        """Keep what the workers say about a dispatch (before it is published: from its first
        word on)."""
        if did in self._trackers:
            return self._trackers[did]
        tracker = _Tracker(did, started=started)
        self._trackers[did] = tracker
        await self._ensure_statuses()
        return tracker

    def _untrack(self, did: str) -> None:
        self._trackers.pop(did, None)

    async def _ensure_statuses(self) -> None:
        """One subscription to every activation's status subject, not one per dispatch (made
        and removed on the server for each activation). Only the leading orchestrator
        launches and watches, so it is the one that hears them all."""
        if self._statuses is not None:
            return
        async with self._statuses_made:
            if self._statuses is None:
                self._given_up = await self._nc.subscribe(
                    MAX_DELIVERIES_ADVISORY + self.topology.activations_stream + ".*",
                    cb=self._on_given_up,
                )
                self._statuses = await self._nc.subscribe(
                    self.topology.pool_status_subject("*"), cb=self._on_status
                )

    async def _on_given_up(self, msg: Msg) -> None:
        """JetStream's advisory that a message reached its consumer's `max_deliver`: if it is
        a dispatch no worker started, its attempt is lost (retryable) now, not at its
        deadline."""
        try:
            advisory = json.loads(msg.data)
            seq, deliveries = int(advisory["stream_seq"]), int(advisory.get("deliveries", 0))
        except (ValueError, TypeError, KeyError):
            return
        for tracker in self._trackers.values():
            if tracker.seq == seq and not tracker.started and tracker.final is None:
                log.warning("pool.dispatch_given_up", dispatch=tracker.dispatch_id,
                            deliveries=deliveries)  # fmt: skip
                tracker.given_up_after = max(deliveries, 1)
                tracker.changed.set()

    async def _on_status(self, msg: Msg) -> None:
        try:
            status = PoolStatus.model_validate_json(msg.data)
        except ValidationError:
            return
        # By dispatch: an earlier attempt's worker may still speak on the same subject.
        tracker = self._trackers.get(status.dispatch_id)
        if tracker is None:
            if status.kind in {"started", "heartbeat"} and status.dispatch_id in self._cleaned:
                # A run of an attempt ended here speaks: its worker, cut off past the heartbeat
                # timeout (the attempt ended lost), missed the one stop sent then and is back.
                # Stopped again now — else it ran on to its deadline, holding a slot and the
                # session's warm workspace, its runner calling the model until fenced.
                self._stop_again(status)
            return
        if not tracker.update(status):
            return
        if status.kind == "exited" and tracker.affinity_key is not None:
            if status.warm:
                self._keep_warm(tracker.affinity_key, status.worker_id, time.monotonic())
            else:
                self._warm.pop(tracker.affinity_key, None)

    def _stop_again(self, status: PoolStatus) -> None:
        """Broadcast the cancel of a run ended here again, at most once per heartbeat
        timeout — in a task of its own: this callback handles every dispatch's status, and
        a flush waiting on a slow NATS would hold live runs' heartbeats back."""
        now = time.monotonic()
        last = self._stopped_again.get(status.dispatch_id)
        if last is not None and now - last < self.settings.heartbeat_timeout_seconds:
            return
        self._stopped_again[status.dispatch_id] = now
        log.warning("pool.ended_run_still_running", dispatch=status.dispatch_id,
                    worker=status.worker_id)  # fmt: skip
        ended = Handle(status.activation_id, self.name, status.dispatch_id)
        task = asyncio.create_task(self._broadcast_cancel(ended))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def _ensure_presence(self) -> None:
        if self._presence is not None:
            return

        async def on_beat(msg: Msg) -> None:
            with contextlib.suppress(ValidationError):
                info = PoolWorkerInfo.model_validate_json(msg.data)
                now = time.monotonic()
                self._workers[info.worker_id] = (now, info)
                for key in info.warm_keys:  # an orchestrator that just took over learns them
                    if key not in self._warm:
                        self._keep_warm(key, info.worker_id, now)

        self._presence = await self._nc.subscribe(self.topology.pool_worker_filter(), cb=on_beat)
        self._presence_since = time.monotonic()

    async def _ask_workers(self, dispatch_id: str | None = None) -> list[PoolWorkerInfo]:
        """Request on `pool.list` and gather every worker's answer for a moment (about one
        dispatch's exit, or every recent one)."""
        inbox = self._nc.new_inbox()
        body = PoolListRequest(dispatch_id=dispatch_id).model_dump_json().encode()
        answers: list[PoolWorkerInfo] = []

        async def on_answer(msg: Msg) -> None:
            with contextlib.suppress(ValidationError):
                answers.append(PoolWorkerInfo.model_validate_json(msg.data))

        sub = await self._nc.subscribe(inbox, cb=on_answer)
        try:
            await self._nc.publish(self.topology.pool_list_subject(), body, reply=inbox)
            await asyncio.sleep(self.settings.list_timeout_seconds)
        finally:
            with contextlib.suppress(NatsError):
                await sub.unsubscribe()
        return answers


# `<prefix><stream>.<consumer>`: a message its consumer will hand out no more.
MAX_DELIVERIES_ADVISORY = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."


def _handed_back(final: PoolStatus | Exit) -> bool:
    return isinstance(final, PoolStatus) and final.kind == "refused" and final.reason == "busy"


def _silent(tracker: _Tracker) -> str:
    return f"no heartbeat from worker {tracker.worker_id} and no worker claims the dispatch"
