"""What the fault tests of the whole platform share: the stack with every service on the
process backend, a scripted model that works a little and then answers slowly, and the checks
DESIGN.md §13 asks of every fault — no acknowledged event lost, no event twice, every activation
in exactly one terminal state, no effect twice, projections equal to a rebuild."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx
from nats.errors import Error as NatsError

from suzumio.contracts.envelope import EventEnvelope, decode_data
from suzumio.contracts.events import ActivationRequested, SessionMessageAppended
from suzumio.contracts.events.activation import TERMINAL_ACTIVATION_EVENTS
from suzumio.platform.bus.eventstore import envelopes_of
from suzumio.platform.bus.jsapi import stream_last_seq
from suzumio.platform.db import pool as db
from suzumio.platform.projections import load_projections
from suzumio.platform.projections.checkpoints import read_all
from suzumio.platform.projections.reader import LogReader
from suzumio.platform.projections.verify import verify
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from suzumio.testing.processes import ServiceProcess
from tests.e2e.api import World, new_world, on_backend
from tests.e2e.stack import Stack, running_stack
from tests.scheduling import Audit, audit
from tests.support import eventually

SERVICES = ("session", "scheduler", "orchestrator", "toolbroker", "gateway")
ANSWER = "the work is done"


def work_then_answer(delay: float) -> Callable[[dict[str, Any]], Reply]:
    """The model's part: a file written to out/ (a tool call, audited through the broker),
    then — once its result is in the conversation — the answer, after `delay` seconds, so a
    fault can land while activations are mid-run."""

    def respond(request: dict[str, Any]) -> Reply:
        if any(m.get("role") == "tool" for m in request.get("messages") or []):
            return Reply.text(ANSWER, delay=delay)
        return Reply.tool_calls(
            [ToolCall("file_write", {"path": "out/result.txt", "content": "the work"})]
        )

    return respond


@contextlib.asynccontextmanager
async def whole_platform(
    nats_url: str,
    postgres_url: str,
    tmp: Path,
    model_url: str,
    extra_env: dict[str, str] | None = None,
) -> AsyncIterator[Stack]:
    """Every service as its own process, sandboxes on the process backend."""
    env = {"SUZUMIO_MODEL_BASE_URL": f"{model_url}/v1", **(extra_env or {})}
    async with running_stack(nats_url, postgres_url, tmp, SERVICES, env) as stack:
        yield stack


@contextlib.asynccontextmanager
async def platform_at_work(
    nats_url: str, postgres_url: str, tmp: Path, answer_delay: float
) -> AsyncIterator[tuple[Stack, ScriptedModelServer]]:
    """The whole platform (a namespace and a database of its own) and its model, which works
    and then answers after `answer_delay` seconds: the stack every fault test of it starts."""
    async with (
        ScriptedModelServer(default=work_then_answer(delay=answer_delay)) as model,
        whole_platform(nats_url, postgres_url, tmp, model.url) as stack,
    ):
        yield stack, model


def service(stack: Stack, name: str) -> ServiceProcess:
    return next(p for p in stack.processes if p.name == name)


async def restart(proc: ServiceProcess) -> None:
    """Start a killed service again (same port, same log) and wait until it is ready."""
    proc.start()
    await proc.wait_ready(timeout=120)


async def requested(stack: Stack, world: World) -> list[str]:
    stream = await stack.store.load("session", world.session_id)
    return [e.data.activation_id for e in stream.events if isinstance(e.data, ActivationRequested)]


async def story(stack: Stack, activation_id: str) -> list[str]:
    return [e.envelope.type for e in (await stack.store.load("activation", activation_id)).events]


async def started(stack: Stack, worlds: list[World]) -> int:
    """How many of the worlds' activations have started so far."""
    count = 0
    for world in worlds:
        for activation_id in await requested(stack, world):
            count += "activation.started" in await story(stack, activation_id)
    return count


@dataclass
class Posted:
    """What a client sending messages through the API saw: the messages acknowledged (201,
    with their ids), those an answer lost made all the same (the retry refused as a
    duplicate), and the texts of those whose fate it never learned."""

    acknowledged: dict[str, tuple[str, str]] = field(default_factory=dict)  # text -> ids
    made_unseen: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


async def post_until_acknowledged(
    stack: Stack, world: World, text: str, posted: Posted, *, attempts: int = 40
) -> None:
    """Post a message as a careful client does through an outage: with an `Idempotency-Key`,
    sent again (the same key) after a 5xx or a lost connection, until it is acknowledged."""
    headers = {"Idempotency-Key": "post-" + text.replace(" ", "-")}
    lost = False  # an attempt may have run: its connection broke, or its command timed out
    async with stack.client(world.key) as c:
        for _ in range(attempts):
            try:
                answer = await c.post(
                    f"/v1/sessions/{world.session_id}/messages",
                    json={"text": text},
                    headers=headers,
                )
            except httpx.TransportError:
                lost = True
                await asyncio.sleep(0.5)
                continue
            if answer.status_code == 201:
                body = answer.json()
                posted.acknowledged[text] = (body["message_id"], body["signal_id"])
                return
            if answer.status_code == 409 and lost:
                # Sent again under the same ids after an answer that said nothing: refused
                # as a duplicate, the first attempt made it.
                assert answer.json()["code"] == "conflict", answer.text
                posted.made_unseen.append(text)
                return
            assert answer.status_code >= 500, (answer.status_code, answer.text)  # never refused
            lost = lost or answer.status_code == 504  # the command's fate unknown
            await asyncio.sleep(0.5)
    posted.unknown.append(text)


class TimelineWatcher:
    """A client of a session's SSE timeline that reconnects (with `Last-Event-ID`, the last
    cursor it was given) whenever the stream ends or breaks; what it saw of the log."""

    def __init__(self, stack: Stack, world: World) -> None:
        self._stack, self._world = stack, world
        self.event_ids: list[str] = []
        self.connected = asyncio.Event()
        self.reconnects = 0
        self.refusals: list[tuple[int, bytes]] = []  # what answered in place of the stream
        self._cursor: str | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._follow())
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _follow(self) -> None:
        url = f"/v1/sessions/{self._world.session_id}/stream"
        while True:
            headers = {"Last-Event-ID": self._cursor} if self._cursor else {}
            try:
                async with (
                    self._stack.client(self._world.key) as c,
                    c.stream("GET", url, headers=headers, timeout=None) as response,
                ):
                    if response.status_code == 200:
                        self.connected.set()
                        await self._read(response)
                    else:
                        self.refusals.append((response.status_code, await response.aread()))
            except httpx.TransportError as exc:
                self.refusals.append((0, repr(exc).encode()))
            self.reconnects += 1
            await asyncio.sleep(0.5)

    async def _read(self, response: httpx.Response) -> None:
        event, data, cursor = "", "", None
        async for line in response.aiter_lines():
            if line.startswith("id:"):
                cursor = line[3:].strip()
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data = line[5:].strip()
            elif not line:  # an item's end
                if event not in {"live", "end", ""}:
                    self.event_ids.append(json.loads(data)["id"])
                if cursor is not None:
                    self._cursor = cursor
                event, data, cursor = "", "", None


async def all_ended(stack: Stack, ids: list[str], timeout: float = 120) -> list[list[str]]:
    """The stories of the activations once every one of them has ended."""

    async def stories() -> list[list[str]]:
        return [await story(stack, i) for i in ids]

    return await eventually(
        stories,
        lambda all_: all(any(t in TERMINAL_ACTIVATION_EVENTS for t in s) for s in all_),
        timeout=timeout,
        what="every activation's end",
    )


def one_end_each(stories: list[list[str]]) -> None:
    ends = Counter(t for types in stories for t in types if t in TERMINAL_ACTIVATION_EVENTS)
    print(f"activations by outcome: {dict(ends)}")  # noqa: T201 - what the fault did
    for types in stories:
        assert len([t for t in types if t in TERMINAL_ACTIVATION_EVENTS]) == 1, types
        assert types.count("activation.started") <= 1, types
        assert types.count("activation.output_recorded") <= 1, types


async def whole_log(stack: Stack) -> list[EventEnvelope]:
    """Every event of the log, in order; the log holds no event twice (by id) and each
    aggregate's versions run 1, 2, 3… without a gap or a repeat."""
    last = await stream_last_seq(stack.nc, stack.topology.events_stream)
    envelopes: list[EventEnvelope] = []
    async with LogReader(stack.nc, stack.topology, start_seq=1) as reader:
        seq = 0
        while seq < last:
            batch = await reader.fetch(timeout=5.0)
            assert batch, f"the log stopped short at {seq} of {last}"
            for msg in batch:
                seq = msg.metadata.sequence.stream
                envelopes += envelopes_of(msg.data)
    twice = [i for i, n in Counter(e.id for e in envelopes).items() if n > 1]
    assert twice == [], f"events in the log twice: {twice}"
    versions: dict[tuple[str, str], int] = {}
    for e in envelopes:
        key = (e.aggregate, e.aggregate_id)
        assert e.version == versions.get(key, 0) + 1, (key, e.version, versions.get(key))
        versions[key] = e.version
    return envelopes


def no_output_twice(envelopes: list[EventEnvelope]) -> None:
    """No activation wrote the same history entry twice (a retried call applied again)."""
    entries: Counter[tuple[str, str, str, str]] = Counter()
    for e in envelopes:
        if e.type == "session.message_appended":
            data = decode_data(e)
            assert isinstance(data, SessionMessageAppended)
            if data.activation_id is not None:
                entries[(data.activation_id, data.role, data.text, data.tool_call_id or "")] += 1
    assert [k for k, n in entries.items() if n > 1] == []


def no_audit_twice(envelopes: list[EventEnvelope]) -> None:
    """Each tool call of an activation is audited once: one start and at most one finish."""
    records: Counter[tuple[str, str, str]] = Counter()
    for e in envelopes:
        if e.type in {"activation.tool_call_started", "activation.tool_call_finished"}:
            records[(e.aggregate_id, e.type, str(e.data.get("call_id")))] += 1
    assert [k for k, n in records.items() if n > 1] == []


def user_messages(envelopes: list[EventEnvelope]) -> Counter[str]:
    """How often each user message's text is in the log."""
    found: Counter[str] = Counter()
    for e in envelopes:
        if e.type == "session.message_appended":
            data = decode_data(e)
            assert isinstance(data, SessionMessageAppended)
            if data.role == "user":
                found[data.text] += 1
    return found


def messages_kept(envelopes: list[EventEnvelope], posted: Posted) -> None:
    """Every acknowledged message is in the log once, with the ids the client was given;
    one whose fate the client never learned is there at most once."""
    found = user_messages(envelopes)
    ids = {
        data.message_id
        for e in envelopes
        if e.type == "session.message_appended"
        and isinstance(data := decode_data(e), SessionMessageAppended)
    }
    for text, (message_id, _) in posted.acknowledged.items():
        assert found[text] == 1, (text, found[text])
        assert message_id in ids, text
    for text in posted.made_unseen:
        assert found[text] == 1, (text, found[text])
    for text in posted.unknown:
        print(f"fate unknown to the client: {text!r}, in the log {found[text]} times")  # noqa: T201
        assert found[text] <= 1, (text, found[text])


async def signals_settled(stack: Stack, signal_ids: list[str], timeout: float = 120) -> Audit:
    """Each signal done by exactly one completed activation, or closed as failed; never two
    live activations for one session."""

    def settled(result: Audit | None) -> bool:
        return result is not None and all(
            result.completed_deliveries(s) or s in result.closed_failed for s in signal_ids
        )

    async def read() -> Audit | None:
        # A cluster that just got a node back may leave a JetStream API request of this
        # reader's unanswered while it elects: read again, as the platform's clients retry.
        try:
            return await audit(stack.nc, stack.topology)
        except (TimeoutError, NatsError):
            return None

    result = await eventually(read, settled, timeout=timeout, what="every signal done or failed")
    assert result is not None
    assert result.violations == []
    for signal_id in signal_ids:
        done = result.completed_deliveries(signal_id)
        failed = signal_id in result.closed_failed
        assert (len(done), failed) in {(1, False), (0, True)}, (signal_id, done, failed)
    return result


async def projections_equal_a_rebuild(stack: Stack, timeout: float = 90) -> None:
    """The projector caught up with the log's end, and what it built equals a rebuild from
    the log (asked again while late events still arrive)."""
    projections = load_projections()
    pool = await db.create_pool(stack.database_url, "fault-check", max_size=2)
    try:

        async def lag() -> int:
            last = await stream_last_seq(stack.nc, stack.topology.events_stream)
            rows = await read_all(pool)
            return max(
                last - rows[p.name].position if p.name in rows else last for p in projections
            )

        async def compared() -> list[Any]:
            await eventually(lag, lambda n: n == 0, timeout=timeout, what="projections caught up")
            last = await stream_last_seq(stack.nc, stack.topology.events_stream)
            results = await verify(stack.nc, stack.database_url, stack.topology, projections)
            return [(r.projection, r.position == last, r.equal, r.tables) for r in results]

        await eventually(
            compared,
            lambda rs: all(at_end and equal for _, at_end, equal, _ in rs),
            timeout=timeout,
            what="projections equal to a rebuild",
        )
    finally:
        await pool.close()


async def under_way(
    platform: Stack, prefix: str, count: int, backend: str = "process"
) -> tuple[list[World], Posted]:
    """`count` worlds, their agents on `backend`, each with a message acknowledged, two of
    their runs started at least."""
    worlds = [await new_world(platform, f"{prefix}{i}") for i in range(count)]
    for world in worlds:
        await on_backend(platform, world, backend)
    posted = Posted()
    for i, world in enumerate(worlds):
        await post_until_acknowledged(platform, world, f"before {i}", posted)
    await eventually(
        lambda: started(platform, worlds), lambda n: n >= 2, timeout=90, what="runs under way"
    )
    return worlds, posted


async def done_once(
    platform: Stack, worlds: list[World], posted: Posted
) -> tuple[Audit, list[EventEnvelope]]:
    """Every message acknowledged is done once (or closed as failed), every activation ended
    once, no output twice, and the projections equal a rebuild; the signals' audit and the
    log, for the caller's own checks."""
    signal_ids = [signal_id for _, signal_id in posted.acknowledged.values()]
    result = await signals_settled(platform, signal_ids, timeout=150)
    ids = [a for world in worlds for a in await requested(platform, world)]
    one_end_each(await all_ended(platform, ids, timeout=60))
    envelopes = await whole_log(platform)
    messages_kept(envelopes, posted)
    no_output_twice(envelopes)
    await projections_equal_a_rebuild(platform)
    return result, envelopes


async def new_work_and_done_once(
    platform: Stack, worlds: list[World], posted: Posted
) -> list[EventEnvelope]:
    """After a fault: every world but the first takes a new message and does it (the
    services take work again), and `done_once` holds. The log, for the caller's checks."""
    for i, world in enumerate(worlds[1:], 1):
        await post_until_acknowledged(platform, world, f"after {i}", posted)
    assert not posted.unknown, posted
    result, envelopes = await done_once(platform, worlds, posted)
    after = [posted.acknowledged[f"after {i}"][1] for i in range(1, len(worlds))]
    assert all(result.completed_deliveries(s) for s in after), "new work failed after the fault"
    return envelopes
