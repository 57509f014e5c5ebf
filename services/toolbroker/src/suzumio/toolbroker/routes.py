"""The runner API (DESIGN.md §7): every route checks the caller first, then turns the call into
events (its own, on the activation's subject), commands (to the session service and the
scheduler) or live chunks. Routes are idempotent where a runner retries."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_json

from suzumio.contracts.broker import (
    MAX_RECEIVED,
    AskOutcome,
    AskRequest,
    CheckpointPut,
    CompactionMarker,
    FinalCall,
    HistoryAppend,
    HistoryEntryIn,
    Recorded,
    SignalsTake,
    SignalsTaken,
    StreamBatch,
    SupportCall,
    SupportResult,
    ToolCallFinish,
    ToolCallStart,
)
from suzumio.contracts.commands import (
    AppendHistory,
    CompactHistory,
    CreatePendingAction,
    HistoryEntry,
    SaveCheckpoint,
    TakeSignals,
)
from suzumio.contracts.errors import (
    CommandError,
    CommandTimeoutError,
    ConflictError,
    InternalError,
    UnavailableError,
    is_id_taken,
)
from suzumio.contracts.events import (
    ActivationOutputRecorded,
    HistoryToolCall,
    PendingActionCreated,
    ToolCallFinished,
    ToolCallStarted,
)
from suzumio.contracts.ids import Identifier, derived_id
from suzumio.contracts.live import LiveChunk
from suzumio.contracts.runner import CheckpointRef, SignalSpec
from suzumio.contracts.subjects import LIVE_DUPLICATE_WINDOW_SECONDS
from suzumio.contracts.values import MAX_JSON_DEPTH, PendingKind
from suzumio.platform import telemetry
from suzumio.platform.logging import get_logger
from suzumio.platform.shares import Shares
from suzumio.toolbroker.access import Caller
from suzumio.toolbroker.own_writes import append_own, output_in_log, started_in_log
from suzumio.toolbroker.policy import approval_asked, permit
from suzumio.toolbroker.problems import BrokerError
from suzumio.toolbroker.registry import LiveActivation
from suzumio.toolbroker.state import Broker
from suzumio.toolbroker.support import SupportContext

log = get_logger(__name__)

MAX_CHECKPOINT_BYTES = 256 * 1024
MAX_STREAM_BATCH_CHARS = 2_000_000  # text and data (as JSON): the runner sends ≤ 1 M of text
HEADER_ROOM = 64  # a live message's header block, but for its `Nats-Msg-Id` value


def _plain_json(value: object, what: str) -> None:
    """Free-form JSON a call brings (usage, checkpoint data, live data, support arguments) nests
    at most as deep as the contracts' payloads: the log's readers parse a message with a
    recursion limit of 200 levels, so an event holding deeper JSON would be stored fine and then
    read by nobody (the activation's or the session's whole subject with it). The runner itself
    never sends more than 64 levels.

    422 unless `value` can be stored and read back as JSON: nested at most `MAX_JSON_DEPTH`
    levels, and no lone surrogate (JSON's `\\ud800` escapes let one into a `str`, which no
    encoder writes out: the call would fail halfway, a 500)."""
    if not value:  # most live chunks carry no data: nothing to walk on the hot path
        return
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children: Iterable[object]
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > MAX_JSON_DEPTH:
            raise BrokerError(422, "invalid", f"{what}: nested more than {MAX_JSON_DEPTH} levels")
        stack.extend((child, depth + 1) for child in children)
    try:
        to_json(value)
    except PydanticSerializationError as exc:
        raise BrokerError(422, "invalid", f"{what}: not valid JSON text: {exc}") from None


async def _caller(request: Request) -> Caller:
    return await _checked(request, fenced_ok=False)


async def _output_caller(request: Request) -> Caller:
    return await _checked(request, fenced_ok=True)


async def _checked(request: Request, *, fenced_ok: bool) -> Caller:
    broker: Broker = request.app.state.broker
    caller = await broker.gate.check(request, fenced_ok=fenced_ok)
    # The request's span (FastAPI's, a child of the runner's `traceparent`: the launch's).
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes(
            {
                "suzumio.activation": caller.claims.activation_id,
                "suzumio.session": caller.claims.session_id,
            }
        )
    return caller


async def _broker(request: Request) -> Broker:
    # async: FastAPI runs a plain `def` dependency on its thread pool, a thread hop per call
    broker: Broker = request.app.state.broker
    return broker


Auth = Annotated[Caller, Depends(_caller)]
# The output's route answers a fenced activation itself: what it sent may be on record.
OutputAuth = Annotated[Caller, Depends(_output_caller)]
Shared = Annotated[Broker, Depends(_broker)]
router = APIRouter()


@router.post("/runner/tool-calls/start")
async def tool_call_start(body: ToolCallStart, caller: Auth, broker: Shared) -> Recorded:
    a = caller.activation
    if body.call_id in a.calls_started:
        return Recorded(recorded=False)
    async with a.lock:
        if body.call_id in a.calls_started:
            return Recorded(recorded=False)
        if len(a.calls_started) >= broker.max_tool_calls:
            # Each start is an event in the log for good, and a call id in every replica's
            # memory while the activation lives: a sandbox looping on this route must end.
            # Not a 401/403, which the runner takes for a fence (it would exit saying the
            # token was refused, its output unrecorded): a refused request, which ends the
            # activation failed with this reason in its output.
            raise BrokerError(
                409,
                "limit_reached",
                f"an activation may start at most {broker.max_tool_calls} tool calls",
            )
        wrote = await append_own(
            broker,
            a,
            [
                ToolCallStarted(
                    call_id=body.call_id,
                    tool=body.tool,
                    arguments_digest=body.arguments_digest,
                    arguments_size=body.arguments_size,
                    read_only=body.read_only,
                )
            ],
            caller.actor,
        )
        a.calls_started.add(body.call_id)
        if body.call_id not in a.calls_finished:
            a.call_tools[body.call_id] = body.tool
    if not wrote:  # recorded already: by another replica (counted there), or by a lost answer
        return Recorded(recorded=False)
    broker.metrics.tool_call(
        broker.metrics.tool_label(body.tool, caller.claims.toolpacks), "started"
    )
    return Recorded(recorded=True)


@router.post("/runner/tool-calls/finish")
async def tool_call_finish(
    body: ToolCallFinish, caller: Auth, broker: Shared, request: Request
) -> Recorded:
    a = caller.activation
    if body.call_id not in a.calls_started and not await started_in_log(broker, a, body.call_id):
        raise BrokerError(409, "conflict", "finish of a tool call that was never started")
    if body.call_id in a.calls_finished:
        return Recorded(recorded=False)
    async with a.lock:
        if body.call_id in a.calls_finished:
            return Recorded(recorded=False)
        # Taken before the write: the fold may see the finish meanwhile and drop the name.
        tool = a.call_tools.get(body.call_id, "")
        wrote = await append_own(broker, a, [ToolCallFinished(**body.model_dump())], caller.actor)
        a.calls_finished.add(body.call_id)
        a.call_tools.pop(body.call_id, None)
    if not wrote:  # recorded already: by another replica (counted there), or by a lost answer
        return Recorded(recorded=False)
    label = broker.metrics.tool_label(tool, caller.claims.toolpacks) if tool else ""
    broker.metrics.tool_call(label, body.status, body.duration_ms)
    _tool_span(request.headers, caller, body, tool)
    return Recorded(recorded=True)


def _tool_span(headers: Mapping[str, str], caller: Caller, body: ToolCallFinish, tool: str) -> None:
    """The tool call as a span of the activation's trace, as the runner timed it (it ran in
    the sandbox, which makes no spans): beside the broker's spans of its calls, under the
    launch the runner's `traceparent` names (else under this request's span). Nothing when no
    span is exported (the audit's round trip is measured in `make bench`)."""
    if not telemetry.spans_exported():
        return
    parent: Context | None = telemetry.extract(headers)
    if not trace.get_current_span(parent).get_span_context().is_valid:
        parent = None  # a runner that sends no context: the current one
    end = time.time_ns()
    span = telemetry.tracer.start_span(
        "tool.call",
        context=parent,
        kind=SpanKind.INTERNAL,
        start_time=end - body.duration_ms * 1_000_000,
        attributes={
            "suzumio.activation": caller.claims.activation_id,
            "suzumio.tool": tool or "-",
            "suzumio.tool_call": body.call_id,
            "suzumio.status": body.status,
        },
    )
    if body.status != "ok":
        span.set_status(StatusCode.ERROR, body.status)
    span.end(end_time=end)


MIN_LOG_CHARGE = 1024  # bytes a call counts against its activation's log budget at least
MAX_USAGE_BYTES = 64 * 1024  # an output's usage (its model calls and tokens), as JSON
# Asks of one activation waiting at once on a replica: above a profile's most tool calls at
# once (64), each of which may ask for its approval in the same round.
MAX_ASKS_PER_ACTIVATION = 128
_asking = Shares()  # the asks waiting on this replica, by activation


@dataclass
class _Charge:
    wrote: bool = True
    """Whether the call wrote to the log; a call that finds its writing done already (sent
    again after a lost answer) says False, and its charge is given back."""


@contextlib.contextmanager
def _charged(broker: Broker, caller: Caller, body: BaseModel) -> Iterator[_Charge]:
    """What the call counts against its activation's log budget, or 409 past the budget: each
    of these calls is an event in the log for good, and a sandbox looping on one
    (checkpoints of 256 KB, asks under new ids) could otherwise write on for as long as its
    token lasts. Not a 401/403, which the runner takes for a fence: a refused request, which
    ends the activation failed with this reason in its output."""
    with _charged_bytes(broker, caller, len(body.model_dump_json())) as charge:
        yield charge


@contextlib.contextmanager
def _charged_bytes(broker: Broker, caller: Caller, written: int) -> Iterator[_Charge]:
    """As `_charged`, for `written` bytes of JSON. Counted at once, while the call writes:
    calls side by side each see the others' (counted once written, they all passed the check
    together, past the budget). Given back when the call wrote nothing — refused (a 4xx of
    its own, a refusal of the session service's), or its writing found done already; kept
    when the outcome is unknown (a timeout, the service in trouble): it may have been
    written."""
    a = caller.activation
    size = max(written, MIN_LOG_CHARGE)
    if a.log_bytes + size > broker.log_budget:
        raise BrokerError(
            409,
            "limit_reached",
            f"an activation may write at most {broker.log_budget} bytes to the log through "
            "history, compaction, checkpoint, ask and support calls",
        )
    a.log_bytes += size
    charge = _Charge()
    try:
        yield charge
    except (BrokerError, CommandError) as exc:
        if _refused(exc):
            a.log_bytes -= size
        raise
    if not charge.wrote:
        a.log_bytes -= size


def _refused(exc: BrokerError | CommandError) -> bool:
    """Whether the error says nothing was written: a refusal, not trouble (a timeout, the
    session service unavailable — an append stored with its answer lost says so too — or a
    fault of its)."""
    if isinstance(exc, BrokerError):
        return exc.status < 500
    return not isinstance(exc, CommandTimeoutError | InternalError | UnavailableError)


@router.post("/runner/history")
async def history(body: HistoryAppend, caller: Auth, broker: Shared) -> Recorded:
    _distinct(body.entries)
    _model_replies(body.entries)
    with _charged(broker, caller, body) as charge:
        # A retry of entries recorded already writes nothing.
        charge.wrote = await _append_history(broker, caller, body.entries)
    return Recorded(recorded=charge.wrote)


def _model_replies(entries: Sequence[HistoryEntryIn]) -> None:
    """The model's replies among history entries, as events of the request's span: when the
    broker learnt of each. The runner reports no timing of its model calls (nor can it send
    spans from its sandbox), so they are marked in the trace, not drawn as spans of made-up
    length; their tokens are on the output's span and in `suzumio_model_tokens_total`."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    for entry in entries:
        if entry.role == "assistant":
            span.add_event(
                "model.reply",
                {"suzumio.message": entry.message_id, "suzumio.tool_calls": len(entry.tool_calls)},
            )


def _distinct(entries: Sequence[HistoryEntryIn]) -> None:
    """Entries of one call name different messages: a repeated id is a confused runner, and
    taking either copy would be a guess."""
    seen: set[str] = set()
    for entry in entries:
        if entry.message_id in seen:
            raise BrokerError(
                422, "invalid", f"history entries repeat the message id {entry.message_id}"
            )
        seen.add(entry.message_id)


async def _append_history(
    broker: Broker, caller: Caller, appended: Sequence[HistoryEntryIn]
) -> bool:
    c = caller.claims
    entries = tuple(
        HistoryEntry(
            message_id=e.message_id,
            role=e.role,
            text=e.text,
            tool_calls=tuple(HistoryToolCall(**t.model_dump()) for t in e.tool_calls),
            tool_call_id=e.tool_call_id,
            name=e.name,
        )
        for e in appended
    )
    reply = await broker.commands.send(
        AppendHistory(
            session_id=c.session_id,
            activation_id=c.activation_id,
            agent_id=c.agent_id,
            entries=entries,
        ),
        actor=caller.actor,
    )
    return bool(reply.result.get("appended"))


@router.post("/runner/history/compaction")
async def compaction(body: CompactionMarker, caller: Auth, broker: Shared) -> Recorded:
    c = caller.claims
    with _charged(broker, caller, body) as charge:
        reply = await broker.commands.send(
            CompactHistory(
                session_id=c.session_id, activation_id=c.activation_id, **body.model_dump()
            ),
            actor=caller.actor,
        )
        charge.wrote = bool(reply.events)
    return Recorded(recorded=charge.wrote)


@router.post("/runner/stream")
async def stream(body: StreamBatch, caller: Auth, broker: Shared) -> Recorded:
    return Recorded(recorded=await _publish_live(broker, caller, body))


async def _publish_live(broker: Broker, caller: Caller, body: StreamBatch) -> bool:
    """Whether the batch was published: not once the activation is past its live budget."""
    c = caller.claims
    now = datetime.now(UTC)
    for chunk in body.chunks:
        _plain_json(chunk.data, "a live chunk's data")
    # Checked whole before the first publish (a batch is published entirely or not at all),
    # and before any chunk is serialised for it.
    size = sum(len(chunk.text) + len(to_json(chunk.data)) for chunk in body.chunks)
    if size > MAX_STREAM_BATCH_CHARS:
        raise BrokerError(
            413, "too_large", f"at most {MAX_STREAM_BATCH_CHARS} characters of text and data"
        )
    try:
        payloads = [
            LiveChunk(
                session_id=c.session_id,
                activation_id=c.activation_id,
                kind=chunk.kind,
                text=chunk.text,
                data=chunk.data,
                at=now,
            )
            .model_dump_json()
            .encode()
            for chunk in body.chunks
        ]
    except PydanticSerializationError as exc:  # a lone surrogate JSON let into `data`
        raise BrokerError(422, "invalid", f"a live chunk is not valid Unicode: {exc}") from None
    ids = [
        None if body.batch is None else f"{c.activation_id}.{body.batch}.{i}"
        for i in range(len(payloads))
    ]
    # The server counts the headers in max_payload, and answers a message over it by closing
    # the connection (failing every request on it), not by refusing that message.
    room = broker.nc.max_payload - HEADER_ROOM - len(ids[-1] or "")
    if max(len(p) for p in payloads) > room:
        raise BrokerError(413, "too_large", "a chunk is larger than the bus carries")
    subject = broker.topology.live_subject(c.session_id)
    size = sum(map(len, payloads))
    a = caller.activation
    counted = _counted(a, size, broker.live_budget, body.batch, len(payloads), _live_window(broker))
    if counted is None:
        await _live_cut(broker, caller, subject, now)
        return False
    acks = [
        broker.js.publish(
            subject, payload, headers=None if msg_id is None else {"Nats-Msg-Id": msg_id}
        )
        for payload, msg_id in zip(payloads, ids, strict=True)
    ]
    try:
        await asyncio.gather(*acks)  # in order: one publisher, one connection
    except BaseException:
        # Not published (or not known to be): not spent. Else a few refused or lost
        # publishes used the budget up, and viewers were told it was passed.
        if counted:
            a.live_bytes -= size
            if body.batch is not None:
                a.live_counted.pop(body.batch, None)
        raise
    return True


LIVE_BATCHES_KEPT = 64  # batches remembered per activation, to count a resent one once
RESEND_MARGIN_SECONDS = 5.0  # a resend this close to LIVE forgetting its ids counts anew


def _live_window(broker: Broker) -> float:
    """How long LIVE remembers a chunk's message id: its duplicate window, which the
    stream's max age shortens."""
    window = LIVE_DUPLICATE_WINDOW_SECONDS
    if broker.topology.live_max_age_seconds:
        window = min(window, broker.topology.live_max_age_seconds)
    return window


def _counted(
    a: LiveActivation, size: int, budget: int, batch: int | None, chunks: int, window: float
) -> bool | None:
    """Counts the batch when it fits (before any await: two batches of one activation on
    their way at once are both counted): True if counted now, False if it was counted before
    (sent again after its answer was lost), None if it does not fit.

    A batch is taken as sent again — published, and not counted — only when LIVE drops all of
    it as duplicates: no more chunks than it knows the ids of under the batch's number (the
    number and the chunk's index), well within `window` of when it stored the oldest of them.
    Else a sandbox could send a small batch, then ever larger ones under its number,
    published uncounted, and the live budget would bound nothing. LIVE forgets an id a
    window after it stored it, whatever came again since: a batch counted again (more
    chunks) keeps the time of its first count until a whole window has passed."""
    if a.live_cut:
        return None
    now = time.monotonic()
    before = a.live_counted.get(batch) if batch is not None else None
    if before is not None:
        known_chunks, first_at = before
        if chunks <= known_chunks and now - first_at < window - RESEND_MARGIN_SECONDS:
            return False
    if a.live_bytes + size > budget:
        return None
    a.live_bytes += size
    if batch is not None:
        if before is not None and now - before[1] < window:  # its old ids may still be known
            entry = (max(chunks, before[0]), before[1])
        else:  # all forgotten: stored anew now
            entry = (chunks, now)
        a.live_counted.pop(batch, None)  # the newest, the last to be forgotten
        a.live_counted[batch] = entry
        if len(a.live_counted) > LIVE_BATCHES_KEPT:
            del a.live_counted[next(iter(a.live_counted))]
    return True


async def _live_cut(broker: Broker, caller: Caller, subject: str, now: datetime) -> None:
    """Once: the activation's live output stops here, and its viewers are told so."""
    a = caller.activation
    if a.live_cut:
        return
    a.live_cut = True
    budget = broker.live_budget
    log.warning("broker.live_cut", activation=a.id, published=a.live_bytes, budget=budget)
    notice = LiveChunk(
        session_id=caller.claims.session_id,
        activation_id=a.id,
        kind="state",
        text=f"live output stopped: the activation published its {budget} bytes of it; "
        "the session's history has the record",
        data={"live_cut": True, "budget_bytes": budget},
        at=now,
    )
    try:
        headers = {"Nats-Msg-Id": f"{a.id}.live_cut"}
        await broker.js.publish(subject, notice.model_dump_json().encode(), headers=headers)
    except Exception as exc:  # best-effort, as live output is
        log.warning("broker.live_unpublished", activation=a.id, error=repr(exc))


@router.post("/runner/signals")
async def take_signals(body: SignalsTake, caller: Auth, broker: Shared) -> SignalsTaken:
    """The due P1 signals, handed over to the activation (the scheduler's `take_signals`)."""
    return await _take_signals(caller, broker, body.received)


@router.get("/runner/signals")
async def signals(
    caller: Auth,
    broker: Shared,
    received: Annotated[list[Identifier] | None, Query(max_length=MAX_RECEIVED)] = None,
) -> SignalsTaken:
    """As `POST /runner/signals`, for runners from before it (`received` in the query)."""
    return await _take_signals(caller, broker, tuple(received or ()))


async def _take_signals(caller: Caller, broker: Broker, received: tuple[str, ...]) -> SignalsTaken:
    c = caller.claims
    reply = await broker.commands.send(
        TakeSignals(session_id=c.session_id, activation_id=c.activation_id, received=received),
        actor=caller.actor,
    )
    raw: list[dict[str, Any]] = reply.result.get("signals", [])
    return SignalsTaken(signals=tuple(SignalSpec.model_validate(s) for s in raw))


@router.post("/runner/ask")
async def ask(body: AskRequest, caller: Auth, broker: Shared) -> AskOutcome:
    # A few asks of an activation's at once on a replica: each may hold its request for
    # minutes (`wait_seconds`), and one asked again writes nothing new, so the log budget
    # bounded nothing — a sandbox could hold tens of thousands open, each a socket and a
    # waiter. A 503 (sent again after Retry-After), as an upload past its share gets.
    activation_id = caller.claims.activation_id
    if _asking.held(activation_id) >= MAX_ASKS_PER_ACTIVATION:
        raise BrokerError(
            503,
            "unavailable",
            f"an activation waits on at most {MAX_ASKS_PER_ACTIVATION} asks at once",
            {"Retry-After": "1"},
        )
    release = _asking.take(activation_id)
    try:
        return await _ask(body, caller, broker)
    finally:
        release()


async def _ask(body: AskRequest, caller: Caller, broker: Broker) -> AskOutcome:
    c = caller.claims
    prompt = body.prompt
    if body.kind is PendingKind.APPROVAL:  # how `ask` itself works: of one call, worded here
        if body.tool is None or body.approved_call is None:
            raise BrokerError(422, "invalid", "an approval names its tool and approved_call")
        prompt = approval_asked(c.session_id, body.pending_action_id, body.tool, body.approved_call)
    else:
        await permit(broker.store, c, "ask_user", body.approved_call, _asks(body))
    pending_action_id = body.pending_action_id  # an approval's: derived from this session
    if body.kind is not PendingKind.APPROVAL:
        pending_action_id = await _question_id(broker, c.session_id, body.pending_action_id)
    waiter = broker.waiter
    with waiter.watch(pending_action_id) as outcome:
        with _charged(broker, caller, body) as charge:  # the wait for its answer aside
            try:
                await broker.commands.send(
                    CreatePendingAction(
                        pending_action_id=pending_action_id,
                        session_id=c.session_id,
                        activation_id=c.activation_id,
                        kind=body.kind,
                        prompt=prompt,
                        options=body.options,
                        paths=body.paths,
                        timeout_seconds=body.timeout_seconds,
                    ),
                    actor=caller.actor,
                )
            except ConflictError as exc:
                if not is_id_taken(exc):
                    raise  # e.g. the session is closed: nothing was asked
                # Asked before (a retry), which wrote nothing: its outcome may be known — if
                # it is this session's.
                charge.wrote = False
                if await _pending_session(broker, pending_action_id) != c.session_id:
                    raise BrokerError(404, "not_found", "no such pending action") from None
        return await waiter.outcome(pending_action_id, outcome, body.wait_seconds)


async def _question_id(broker: Broker, session_id: str, asked_as: str) -> str:
    """The pending action of a question asked under `asked_as` (the runner's id): an id
    derived from the session and it, answered in `AskOutcome.pending_action_id`. Pending
    actions are one namespace for all sessions, and an approval's id derives from its session,
    tool and arguments: a question under the runner's id alone could take, from another
    session, the id a call's approval is to be asked under — that call then never approved
    (its ask a 404, the approval walk stopped there).

    A question asked under the runner's own id before this release (its retry, across an
    upgrade) is found there, not asked twice."""
    stream = await broker.store.load("pending_action", asked_as)
    if stream.events:
        created = stream.events[0].data
        if (
            isinstance(created, PendingActionCreated)
            and created.session_id == session_id
            and created.kind is not PendingKind.APPROVAL
        ):
            return asked_as
    return derived_id("question", session_id, asked_as)


@router.put("/runner/checkpoint")
async def put_checkpoint(body: CheckpointPut, caller: Auth, broker: Shared) -> Recorded:
    await permit(
        broker.store,
        caller.claims,
        "checkpoint",
        body.approved_call,
        lambda written: isinstance(written, dict) and written.get("data") == body.data,
    )
    _plain_json(body.data, "the checkpoint's data")
    # In bytes, as the limit says and the bus counts: a character of text may take four.
    # What is stored (its id and data), not the approval the call brought along with it.
    stored = body.model_dump_json(include={"checkpoint_id", "data"})
    if len(stored.encode()) > MAX_CHECKPOINT_BYTES:
        raise BrokerError(413, "too_large", f"checkpoints are at most {MAX_CHECKPOINT_BYTES} bytes")
    c = caller.claims
    with _charged(broker, caller, body) as charge:
        reply = await broker.commands.send(
            SaveCheckpoint(
                session_id=c.session_id,
                activation_id=c.activation_id,
                checkpoint_id=body.checkpoint_id,
                data=body.data,
            ),
            actor=caller.actor,
        )
        charge.wrote = bool(reply.events)  # a retry of one saved already wrote nothing
    return Recorded(recorded=charge.wrote)


@router.get("/runner/checkpoint", response_model=None)
async def get_checkpoint(caller: Auth, broker: Shared) -> CheckpointRef | Response:
    latest = await broker.checkpoints.latest(caller.claims.session_id)
    if latest is None:
        return Response(status_code=204)
    return latest


@router.post("/toolpacks/{toolpack}/support")
async def support(toolpack: str, body: SupportCall, caller: Auth, broker: Shared) -> SupportResult:
    c = caller.claims
    if toolpack != "core" and toolpack not in c.toolpacks:
        raise BrokerError(
            403, "forbidden", f"toolpack {toolpack!r} is not enabled for this activation"
        )
    operation = broker.operations.find(toolpack, body.operation)
    if operation is None:
        raise BrokerError(
            403, "forbidden", f"{body.operation!r} is not an allowed operation of {toolpack!r}"
        )
    _plain_json(body.arguments, "the arguments")
    with _charged(broker, caller, body):
        if toolpack == "core":  # its operations are the core tools of the same names
            await permit(
                broker.store,
                c,
                body.operation,
                body.approved_call,
                lambda written: written == body.arguments,
            )
        ctx = SupportContext(
            c,
            toolpack,
            body.operation,
            body.request_id,
            broker.commands,
            broker.store,
            fence=functools.partial(broker.gate.still_live, caller),
        )
        return SupportResult(result=await operation(ctx, body.arguments))


@router.post("/activation-output")
async def output(body: FinalCall, caller: OutputAuth, broker: Shared) -> Recorded:
    a = caller.activation
    # The contract bounds the text as the event does, and the usage is bounded here: the
    # output cannot be refused (too large for the bus) after the history and the live batch
    # had their effect — a refused call publishes nothing, and one sent again and again
    # wrote history past the log budget each time.
    _plain_json(body.usage, "usage")
    if len(to_json(body.usage)) > MAX_USAGE_BYTES:
        # Not a 422: from the final call, the runner takes that for a broker from before it,
        # and sends the parts apart — the history and the live batch had their effect then.
        raise BrokerError(413, "too_large", f"usage is at most {MAX_USAGE_BYTES} bytes of JSON")
    recorded = ActivationOutputRecorded(text=body.text, usage=body.usage, reason=body.reason)
    _distinct(body.history)
    _model_replies(body.history)
    _usage_on_span(body.usage, body.reason)
    async with a.lock:
        if a.output:
            return Recorded(recorded=False)  # sent again: what came with it was handled then
        if a.fenced:
            # Sent again after its answer was lost, and a cancel (or the end) came between:
            # recorded before the fence, the runner must hear so — refused, it exits as fenced,
            # and its finished work ends cancelled and is done again.
            if await output_in_log(broker, a):
                return Recorded(recorded=False)
            raise BrokerError(403, "fenced", f"the activation is {a.fenced}")
        # Each part idempotent, so a retry repeats nothing. The history first: it is the part
        # that can still be refused (too large for the bus or the log, the session closed), and
        # a refused call must have published nothing. Then the live batch and the output side
        # by side, their publishes sent together: live chunks and log events are not ordered
        # with each other on the session's timeline anyway.
        if body.history:  # counted against the log budget as a history call's entries are
            with _charged_bytes(broker, caller, len(to_json(body.history))) as charge:
                charge.wrote = await _append_history(broker, caller, body.history)
        live = None
        if body.live is not None:
            live = asyncio.ensure_future(_publish_live_last(broker, caller, body.live))
        try:
            # False: the log holds an output already (another replica recorded it, its answer
            # lost): this call recorded nothing, and says so.
            wrote = await append_own(broker, a, [recorded], caller.actor)
        finally:
            if live is not None:
                await live
        a.output = True
    return Recorded(recorded=wrote)


async def _publish_live_last(broker: Broker, caller: Caller, batch: StreamBatch) -> None:
    """The last live batch, which comes with the output: best-effort, the history is the
    record."""
    try:
        await _publish_live(broker, caller, batch)
    except Exception as exc:
        log.warning("broker.live_unpublished", activation=caller.activation.id, error=repr(exc))


def _usage_on_span(usage: Mapping[str, Any], reason: str) -> None:
    """What the activation spent on models, as the runner reports it, on the output's span."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attribute("suzumio.reason", reason)
    for key in ("model_calls", "prompt_tokens", "completion_tokens"):
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            span.set_attribute(f"suzumio.{key}", value)
    if isinstance(model := usage.get("model"), str):
        span.set_attribute("suzumio.model", model[:200])


def _asks(body: AskRequest) -> Callable[[Any], bool]:
    """Whether the `ask_user` arguments the model wrote are this question's (as the runner
    makes its question of them)."""

    def matches(written: Any) -> bool:
        if body.kind is not PendingKind.QUESTION or not isinstance(written, dict):
            return False
        try:  # what the runner could not make a question of is not this one
            options = tuple(str(o) for o in written.get("options") or ())
        except TypeError:
            return False
        return str(written.get("question", "")).strip() == body.prompt and options == body.options

    return matches


async def _pending_session(broker: Broker, pending_action_id: str) -> str | None:
    stream = await broker.store.load("pending_action", pending_action_id)
    for event in stream.events:
        if isinstance(event.data, PendingActionCreated):
            return event.data.session_id
    return None
