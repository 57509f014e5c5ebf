"""The agent loop of one activation (DESIGN.md §9, Appendix A).

A turn: call the model (streaming) → if it asked for tools, run a tool round (segmented,
results in call order, every call audited by the broker) → ask the broker for P1 signals →
loop; else finish. Around it: the model-call budget and its grace call, compaction when the
prompt reaches the threshold or the provider says it overflowed, failure classes with bounded
backoff and the fallback chain, and a larger output cap when a reply was cut off.

Everything the model saw or said is appended to the session's history through the broker, in
the order it happened, so the next activation continues from it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import openai

from suzumio.contracts.broker import (
    CompactionMarker,
    HistoryEntryIn,
    HistoryToolCallIn,
    ToolCallFinish,
    ToolCallStart,
)
from suzumio.contracts.ids import derived_id, new_id
from suzumio.contracts.policies import arguments_digest, effective_policy
from suzumio.contracts.runner import RunnerActivationInput, SignalSpec
from suzumio.contracts.values import ToolPolicy
from suzumio.runner.broker import (
    BrokerClient,
    BrokerError,
    BrokerUnavailableError,
    FencedError,
    json_size,
)
from suzumio.runner.context import (
    WIRE_CALL_ID,
    build_prompt,
    render_history,
    render_signal,
    wire_call_id,
)
from suzumio.runner.live import NOTICE_SECONDS, LiveStream
from suzumio.runner.log import MIN_SECRET_CHARS, keep_secret, log
from suzumio.runner.loop import compaction, figures
from suzumio.runner.loop.failures import (
    Action,
    FailureClass,
    backoff_seconds,
    classify,
    sleep_in_slices,
)
from suzumio.runner.loop.segments import (
    CallFailure,
    FailureReason,
    PlannedCall,
    run_segments,
    segment,
)
from suzumio.runner.model import ModelClient, ModelTurn, WireCall
from suzumio.runner.toolbox import Toolbox
from suzumio.runner.tools.base import Status, ToolResult, printable
from suzumio.runner.tools.core import CoreOutcome

Message = dict[str, Any]
Reason = Literal["completed", "budget_exhausted", "waiting", "failed"]
MAX_RESULT_CHARS = 200_000  # a history entry holds 1 M; a tool result rarely needs more
MAX_OUTPUT_CHARS = 900_000
MAX_ENTRY_CHARS = 1_000_000  # of text, in a history entry (`HistoryEntryIn`)
# A whole entry's text and arguments as JSON: one bus message holds it (8 MB, the headers and
# the command around it included).
MAX_ENTRY_BYTES = 6_000_000
STAND_IN_BYTES = 16_000  # a stand-in's most, with its escapes
MAX_ARGUMENT_CHARS = 32_000_000  # file.write takes 10 MB of content, JSON-escaped
MAX_ARGUMENT_DEPTH = 64
MAX_ARCHIVED = 10_000  # entries one compaction marker archives (`CompactionMarker`)


class StartRefusedError(BrokerError):
    """The broker refused a tool call's audit start (not a fence): the round's results are
    recorded, and the activation ends failed with the broker's reason."""


SENT_WHILE_ANSWERING = "[received while you were working]"
NO_REPLY = "(The model ended its turn without a reply, twice in a row.)"
CUT_OFF = frozenset({"length", "content_filter"})  # an empty reply of these is not "nothing"
MAX_CALLS_PER_TURN = 128  # what one history entry holds (`HistoryEntryIn.tool_calls`)
END_OPEN_CALLS_SECONDS = 10.0
UNNAMED_TOOL = "(no name)"  # the audit's name of a call the model gave none
UNNAMED_TOOL_SENT_BACK = "unnamed_tool"  # its name in the conversation (a provider's pattern)
_SENDABLE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NOT_SENDABLE = re.compile(r"[^A-Za-z0-9_-]")
# How a call that gave no result of its own ends, in its audit record.
_FAILED: dict[FailureReason, Status] = {
    "error": "error",
    "timeout": "timeout",
    "not_started": "timeout",
    "cancelled": "cancelled",
}
"""No tool takes arguments nested deeper; deeper ones would only reach recursive code
(JSON encoding, compaction) near Python's recursion limit."""
GRACE_FAILED = (
    "The model-call budget of this activation ran out before the work was done, and the model "
    "could not summarise where it stands"
)
GRACE_PROMPT = (
    "You have used all the model calls this activation may make. Do not call tools. Summarise "
    "where the work stands: what is done, what is not, and what should happen next."
)


class ModelFailedError(Exception):
    def __init__(self, failure_class: str, message: str, earlier: tuple[str, ...] = ()) -> None:
        """`earlier`: how each model the chain fell back from failed, in order."""
        super().__init__(f"{failure_class}: {message}")
        self.failure_class = failure_class
        self.earlier = earlier


@dataclass
class Ending:
    reason: Reason
    text: str
    usage: dict[str, Any] = field(default_factory=dict)
    detail: str = ""
    # The last turn's history entries, not sent yet: they go with the output, in one call.
    history: tuple[HistoryEntryIn, ...] = ()


@dataclass
class _Call:
    index: int
    wire: WireCall
    tool: str | None
    args: dict[str, Any] | None
    problem: str | None  # why it cannot run (unknown tool, bad arguments)


class AgentLoop:
    def __init__(
        self,
        spec: RunnerActivationInput,
        broker: BrokerClient,
        models: Sequence[ModelClient],
        toolbox: Toolbox,
        live: LiveStream,
        secrets: Sequence[str] = (),
    ) -> None:
        self.spec = spec
        self._secrets = sorted(
            {x for x in (*secrets, spec.token) if len(x) >= MIN_SECRET_CHARS}, key=len
        )[::-1]
        # Per provider, the keys it refused (401): a refreshed key is tried only if new.
        self._refused_keys: dict[str, set[str]] = {}
        self._broker = broker
        self._models = list(models)
        self._model_index = 0  # sticky: a fallback never hands state back to the primary
        self._fell_back_from: list[str] = []  # how each model given up on failed
        self._toolbox = toolbox
        self._live = live
        self._config = spec.runner
        # The output cap and the compaction threshold are the called model's: a fallback
        # with a smaller window compacts against its own (`loop/figures.py`).
        self._max_tokens, self._max_tokens_cap = figures.output_tokens(
            self._models[0].spec, self._config
        )
        self._governor = compaction.CompactionGovernor(
            max_attempts_per_turn=self._config.compaction.max_attempts_per_turn
        )
        self.prompt = build_prompt(spec)
        self._messages: list[Message] = [{"role": "system", "content": self.prompt.text}]
        self._entry_ids: list[str | None] = [None]
        self._received: list[str] = []
        # Ids of calls in the history count too: the provider and compaction pair a result
        # with its call by id across the whole conversation, not one activation.
        self._open_calls: dict[str, float] = {}  # started in the audit, not finished: since
        # Calls that ran, their audit's end on its way: what each did, and that end.
        self._ran: dict[str, tuple[CoreOutcome, asyncio.Future[int]]] = {}
        # The tool round under way (its calls, and what each that finished did), until its
        # results are recorded: what a cut — the wall clock, a stop, a fault — leaves to say.
        self._round: list[_Call] = []
        self._finished: dict[str, CoreOutcome] = {}
        self._said_nothing_in_a_row = 0
        recorded = {c.id for e in spec.history for c in e.tool_calls} | {
            e.tool_call_id for e in spec.history if e.tool_call_id
        }
        # As sent back, too (`wire_call_id`): a model reusing one it saw would pair with it.
        self._call_ids: set[str] = recorded | {wire_call_id(i) for i in recorded}
        self._usage: dict[str, int] = {"prompt_tokens": 0, "completion_tokens": 0}
        # The provider's real count of the conversation at the last model call that reported
        # one: what the compaction threshold is measured from (none until then, and none
        # again after a compaction changed the messages it counted).
        self._anchor: compaction.UsageAnchor | None = None
        self.model_calls = 0
        self.compactions = 0
        # Every model call that failed, by failure class, the ones a retry, a compaction or
        # a fallback got past included: operators count them (`suzumio_model_call_failures`)
        # to see a provider failing before activations do.
        self._failures: dict[str, int] = {}

    @property
    def _threshold(self) -> int:
        return figures.threshold(self._models[self._model_index].spec, self._config)

    # -- the loop --------------------------------------------------------------------------
    async def run(self) -> Ending:
        for entry_id, message in render_history(self.spec.history):
            self._push(message, entry_id)
        # A message an earlier attempt's compaction archived is in its summary: given again
        # at the end, the model read the request twice and did its work again.
        summarized = set(self.spec.activation.summarized_message_ids)
        await self._take_signals(
            self.spec.activation.signals, _after_the_agent(self.spec) | summarized
        )
        # A notice: an answer that comes within its allowance brings it along.
        self._live.event(
            "state", "running", within=NOTICE_SECONDS, activation_id=self.spec.activation.id
        )
        while True:
            if self.model_calls >= self._config.max_model_calls:
                return await self._grace()
            self._governor.new_turn()
            if compaction.prompt_tokens(self._messages, self._anchor) >= self._threshold:
                await self._compact("threshold")
            turn = await self._call_model(self._toolbox.wire_definitions())
            turn.text = _entry_text(turn.text)
            if self._said_nothing(turn):
                continue  # asked again, once
            dropped = len(turn.tool_calls) - MAX_CALLS_PER_TURN
            if dropped > 0:
                # The reply and its results could not be recorded at all: run what fits, and
                # say in the last result what was left out.
                log("model.too_many_tool_calls", calls=len(turn.tool_calls))
                turn.tool_calls = turn.tool_calls[:MAX_CALLS_PER_TURN]
            calls = self._parse(turn.tool_calls)
            turn.tool_calls = [_as_sent_back(c) for c in calls]
            if not calls:
                return self._ending("completed", turn.text, self._assistant_entry(turn))
            await self._broker.append_history([self._assistant_entry(turn)])
            outcomes = await self._tool_round(calls, dropped=max(dropped, 0))
            complete = next((o.complete for o in outcomes if o.complete is not None), None)
            if complete is not None:
                return self._ending("completed", printable(complete))
            waiting = [o.waiting_for for o in outcomes if o.waiting_for]
            if waiting:
                return self._ending("waiting", f"waiting for {', '.join(waiting)}")
            await self._take_signals(await self._broker.signals(self._received), set())

    # -- model calls -----------------------------------------------------------------------
    async def _call_model(self, tools: list[dict[str, Any]]) -> ModelTurn:
        """One counted model call, with the retries, compactions and fallbacks it needs."""
        retries = 0
        streamed = False
        checked = self._model_index  # the model whose threshold the prompt was checked for

        def on_text(delta: str) -> None:
            nonlocal streamed
            streamed = streamed or bool(delta)
            self._live.text(delta)

        while True:
            if self._model_index != checked:
                checked = self._model_index
                await self._fit_fallback()
            model = self._models[self._model_index]
            if streamed:
                # Live viewers saw an attempt that will not count: tell them to drop its text
                # before the retry streams the reply again.
                self._live.event("state", "retrying: the text above is discarded", discard=True)
                streamed = False
            try:
                turn = await model.complete(
                    self._messages, tools, self._max_tokens, on_text=on_text
                )
            except Exception as exc:
                retries = await self._recover(exc, retries)
                continue
            # Billed, whether the call counts or is asked again below.
            for key in ("prompt_tokens", "completion_tokens"):
                self._usage[key] += turn.usage.get(key, 0)
            if turn.finish_reason == "content_filter":
                # The provider's filter cut the reply short: no answer, though it came as one
                # (what is left of it would end the activation `completed`). As the SDK's own
                # error for it: the next model of the chain, else stop and report.
                retries = await self._recover(openai.ContentFilterFinishReasonError(), retries)
                continue
            if (
                turn.finish_reason == "length"
                and self._max_tokens < self._max_tokens_cap
                and (not turn.tool_calls or _cut_off(turn.tool_calls[-1]))
            ):
                # Cut off by the output cap, in its text or in a call's arguments (a large
                # file.write): ask again with room (not a new counted call).
                self._max_tokens = min(self._max_tokens * 2, self._max_tokens_cap)
                self._live.event("state", "retrying with a larger output cap")
                continue
            self.model_calls += 1
            # A call without usage keeps the previous anchor: the messages it counted are
            # still the start of this conversation.
            self._anchor = compaction.usage_anchor(len(self._messages), turn.usage) or self._anchor
            return turn

    async def _recover(self, exc: Exception, retries: int) -> int:
        """Act on a failed model call (compact, fall back, back off) and return the retry
        count to go on with, or raise when the call cannot succeed."""
        failure = classify(exc)
        self._failed(failure.cls)
        model = self._models[self._model_index]
        log("model.failed", model=model.spec.name, cls=failure.cls, status=failure.status)
        match failure.action:
            case Action.COMPACT:
                if not await self._compact(failure.cls.value):
                    raise self._gave_up(failure.cls, failure.message) from exc
                return retries  # a restart after compaction is not a new call
            case Action.FALLBACK:
                if failure.cls is FailureClass.AUTH and await self._refreshed(model):
                    # The same call again with the key the user put in place since the
                    # launch: neither a counted call nor a spent retry.
                    return retries
                self._fall_back(failure.cls, failure.message, exc)
                return 0
            case Action.STOP:
                if failure.cls is FailureClass.CONTENT_POLICY and self._has_fallback():
                    self._fall_back(failure.cls, failure.message, exc)
                    return 0
                raise self._gave_up(failure.cls, failure.message) from exc
        retries += 1  # retry or back off, a bounded number of times
        if retries > self._config.max_retries:
            self._fall_back(failure.cls, failure.message, exc)  # raises without a fallback
            return 0
        await sleep_in_slices(backoff_seconds(retries, failure.retry_after), cancelled=None)
        return retries

    async def _refreshed(self, model: ModelClient) -> bool:
        """After the provider refused `model`'s key (401): whether the broker had another one
        for its provider — one a user put in place while the activation ran — now used by
        every model of the chain through that provider. A key refused once is never taken
        again, so a broker that answers the same key (or one refused before) sends the loop
        on to the fallback, as does one that has none to give."""
        provider = model.provider
        if provider is None:
            return False  # the platform's default endpoint: no key of a project's to refresh
        refused = self._refused_keys.setdefault(provider, set())
        refused.add(model.api_key)
        try:
            key = await self._broker.credential(model.spec, model.base_url)
        except BrokerUnavailableError as exc:
            log("model.credential_unavailable", model=model.spec.name, error=str(exc))
            return False
        if key is None or key in refused:
            log("model.credential_unchanged", model=model.spec.name, provider=provider)
            return False
        self._keep_secret(key)
        for other in self._models:
            if other.provider == provider:
                other.use_key(key)
        log("model.credential_refreshed", model=model.spec.name, provider=provider)
        return True

    def _keep_secret(self, value: str) -> None:
        """`value` is redacted from now on: in tool results, the audit and the log."""
        keep_secret(value)
        if len(value) >= MIN_SECRET_CHARS:
            self._secrets = sorted({*self._secrets, value}, key=len)[::-1]

    def _has_fallback(self) -> bool:
        return self._model_index + 1 < len(self._models)

    def _fall_back(self, cls: str, message: str, exc: BaseException) -> None:
        if not self._has_fallback():
            raise self._gave_up(cls, message) from exc
        self._fell_back_from.append(cls)
        self._model_index += 1
        spec = self._models[self._model_index].spec
        # Its own output cap from the start: the primary's (perhaps raised after a cut-off
        # reply) may be more than this model can write.
        self._max_tokens, self._max_tokens_cap = figures.output_tokens(spec, self._config)
        log("model.fallback", to=spec.name, cls=cls)

    def _gave_up(self, cls: str, message: str) -> ModelFailedError:
        return ModelFailedError(cls, message, tuple(self._fell_back_from))

    async def _fit_fallback(self) -> None:
        """Before the first call to a model the chain fell back to: a prompt over its own
        threshold (a smaller window than the model before it) is compacted first, instead of
        being sent to fail as too large. Measured as for any model, by the last usage a
        provider reported plus the estimate of what came after."""
        if compaction.prompt_tokens(self._messages, self._anchor) >= self._threshold:
            await self._compact("threshold")

    async def _grace(self) -> Ending:
        self._push({"role": "user", "content": GRACE_PROMPT}, None)
        try:
            turn = await self._call_model([])
        except ModelFailedError as exc:
            # The budget ended the work, not the model: a summary it could not write (Bedrock
            # and Claude gateways refuse a conversation with tool calls but no tools) must not
            # turn it into a failure the orchestrator retries with a fresh budget.
            log("model.grace_failed", error=str(exc))
            model = self._models[self._model_index].spec.name
            # The failure's class only: a provider's message may quote the key it refused,
            # and this text is kept in the session's history.
            turn = ModelTurn(model=model, text=f"{GRACE_FAILED} ({exc.failure_class}).")
        # As any reply, fit for the history (else building its entry raises: no output at
        # all); calls in it are not run — it was offered no tools — nor recorded as asked.
        turn.text = _entry_text(turn.text)
        turn.tool_calls = []
        return self._ending("budget_exhausted", turn.text, self._assistant_entry(turn))

    # -- compaction ------------------------------------------------------------------------
    async def _compact(self, why: str) -> bool:
        now = time.monotonic()
        if not self._governor.may_compact(now):
            log("compaction.blocked", why=why, reason=self._governor.blocked_reason(now))
            return False
        cfg = self._config.compaction
        estimated = compaction.estimate_tokens(self._messages)
        before = compaction.prompt_tokens(self._messages, self._anchor)
        # Pruning and the split measure messages by the estimate; the provider's count says
        # how far off it is for this text (several-fold for CJK), so the target goes into the
        # estimate's units and the result comes back out of them. 1 without an anchor.
        scale = before / max(estimated, 1)
        # The provider said it does not fit: whatever our estimate of the window, aim at half.
        target = self._threshold if why == "threshold" else min(self._threshold, before // 2)
        local_target = int(target / scale)
        pruned = compaction.prune(
            self._messages,
            local_target,
            tail_ratio=cfg.tail_ratio,
            min_tail_messages=cfg.min_tail_messages,
        )
        parts = compaction.split(pruned, local_target, cfg.tail_ratio, cfg.min_tail_messages)
        # A marker names each entry it archives, 10,000 at most: a middle of more failed to
        # be built, every activation of the session ending crashed at its first compaction.
        parts = compaction.at_most(pruned, parts, MAX_ARCHIVED)
        if not parts.middle:
            if (pruned_tokens := compaction.estimate_tokens(pruned)) < estimated:
                self._messages = pruned  # pruning alone helped
                self._anchor = None  # it counted the messages before pruning
                self._governor.record_success(math.ceil(pruned_tokens * scale), target)
                return True
            self._governor.record_failure(now)
            return False
        first = len(parts.head)
        archived = [i for i in self._entry_ids[first : first + len(parts.middle)] if i]
        try:
            summariser = self._models[self._model_index]
            summary = await summariser.complete(
                compaction.summary_request(parts.middle),
                [],
                figures.output_tokens(summariser.spec, self._config)[0],
            )
        except Exception as exc:
            self._failed(classify(exc).cls)
            log("compaction.failed", error=repr(exc))
            self._governor.record_failure(now)
            return False
        # The summary is a model call the provider bills like any other (blank or not): the
        # activation's usage says what it spent.
        for key in ("prompt_tokens", "completion_tokens"):
            self._usage[key] += summary.usage.get(key, 0)
        if not summary.text.strip():
            self._governor.record_failure(now)
            return False
        # Stored as the marker's text, the request it compacted quoted in it.
        summary.text = _entry_text(compaction.marker_text(summary.text, parts.request))
        marker_id = new_id()
        messages = compaction.apply(parts, summary.text)
        after = math.ceil(compaction.estimate_tokens(messages) * scale)
        if archived:
            await self._broker.compaction(
                CompactionMarker(
                    marker_id=marker_id,
                    summary=summary.text,
                    archived_from=archived[0],
                    archived_through=archived[-1],
                    archived_ids=tuple(archived),
                    tokens_before=before,
                    tokens_after=after,
                )
            )
        ids = self._entry_ids
        self._entry_ids = [
            *ids[:first],
            marker_id if archived else None,  # only a recorded marker can be archived later
            *ids[first + len(parts.middle) :],
        ]
        self._messages = messages
        self._anchor = None  # it counted the messages before the summary replaced them
        self._governor.record_success(after, target)
        self.compactions += 1
        self._live.event("state", "compacted", tokens_before=before, tokens_after=after)
        log("compaction.done", why=why, before=before, after=after, archived=len(archived))
        return True

    def _said_nothing(self, turn: ModelTurn) -> bool:
        """Whether `turn` is a reply with neither text nor calls, to be asked for again. A
        model says nothing now and then — after a tool round most often — and taken for its
        answer, the activation ended `completed` with no word of what was done (DESIGN,
        Appendix A), and an empty assistant entry some providers refuse went into the
        history. Asked again once; said nothing twice in a row, the reply is `NO_REPLY`."""
        if turn.tool_calls or turn.text.strip() or turn.finish_reason in CUT_OFF:
            self._said_nothing_in_a_row = 0
            return False
        self._said_nothing_in_a_row += 1
        log("model.empty_reply", model=turn.model, in_a_row=self._said_nothing_in_a_row)
        if self._said_nothing_in_a_row > 1:
            turn.text = NO_REPLY
            return False
        return True

    # -- tools -----------------------------------------------------------------------------
    def _parse(self, wire_calls: Sequence[WireCall]) -> list[_Call]:
        calls = []
        for i, given in enumerate(wire_calls):
            # The history, the audit log and JSON take only text that encodes as UTF-8.
            wire = WireCall(printable(given.id), printable(given.name), printable(given.arguments))
            if given.id in self._call_ids or not WIRE_CALL_ID.fullmatch(given.id):
                # Every id of what a call creates derives from its id: it must be unique. And
                # it is sent back to the models of the chain, which refuse some (a vLLM's 46
                # characters at OpenAI): the conversation would fail for good on fallback.
                unique = f"call_{self.model_calls}_{i}_{new_id()[-12:]}"
                wire = WireCall(unique, wire.name, wire.arguments)
            self._call_ids.add(wire.id)
            tool = self._toolbox.canonical(wire.name)
            args, problem = decode_arguments(wire.arguments)
            if not tool:
                problem = (
                    f"unknown tool {wire.name!r}" if wire.name else "a tool call without a name"
                )
            calls.append(_Call(i, wire, tool, args, problem))
        return calls

    async def _tool_round(self, calls: list[_Call], *, dropped: int = 0) -> list[CoreOutcome]:
        planned = [
            PlannedCall(
                c.index,
                self._toolbox.kind(c.tool, c.args)
                if c.tool and c.args is not None and not c.problem
                else "exclusive",
                self._toolbox.paths(c.tool, c.args)
                if c.tool and c.args is not None and not c.problem
                else (),
            )
            for c in calls
        ]
        segments = segment(planned, self._config.max_parallel_tools)

        self._round, self._finished = calls, {}

        async def run_one(index: int) -> CoreOutcome:
            outcome = await self._run_call(calls[index])
            self._finished[calls[index].wire.id] = outcome
            return outcome

        results = await run_segments(
            segments,
            run_one,
            self._config.tool_timeout_seconds,
            figures.round_allowances((c.index, self._allowed_seconds(c)) for c in calls),
        )
        outcomes: list[CoreOutcome] = []
        entries: list[HistoryEntryIn] = []
        fences: list[FencedError] = []
        for call, result in zip(calls, results, strict=True):
            if isinstance(result, CallFailure):
                outcome = await self._cut_short(call, result, fences)
            else:
                outcome = result
            outcomes.append(outcome)
            text = self._clean(outcome.result.text)
            if dropped and call is calls[-1]:
                text += (
                    f"\n[{dropped} more tool calls of this reply were not run: at most"
                    f" {MAX_CALLS_PER_TURN} in one reply]"
                )
            entry = self._result_entry(call, text)
            self._push(
                {"role": "tool", "tool_call_id": call.wire.id, "content": text}, entry.message_id
            )
            entries.append(entry)
        await self._broker.append_history(entries)
        self._round = []
        # The round's results are recorded; then a refused start, a fence or a broker out of
        # reach ends the activation as it does anywhere else. Told to the model as a failed
        # call instead, a broker that had applied the call (its answers lost) and came back
        # saw the model make it again, under a new call id: a message sent twice.
        for result in results:
            if isinstance(result, CallFailure) and isinstance(
                result.error, StartRefusedError | FencedError | BrokerUnavailableError
            ):
                raise result.error
        if fences:
            raise fences[0]
        return outcomes

    def _result_entry(self, call: _Call, text: str) -> HistoryEntryIn:
        """The history entry of `call`'s result, under an id derived from the activation and
        the call, so the round's record and a cut's (`cut_round`) of the same result are one
        entry, whichever lands."""
        return HistoryEntryIn(
            message_id=derived_id("tool.result", self.spec.activation.id, call.wire.id),
            role="tool",
            text=text,
            tool_call_id=call.wire.id,
            name=(call.tool or call.wire.name)[:200],
        )

    def cut_round(self, why: str) -> tuple[HistoryEntryIn, ...]:
        """The results of the tool round a cut (`why`) stopped before they were recorded: what
        each call that finished did, and for the rest that they were stopped. Left out, the
        next activation (or the retry) read every call of the round as never finished, and the
        model made again what had run — a message sent twice."""
        entries = []
        for call in self._round:
            done = self._finished.get(call.wire.id)
            if done is None and call.wire.id in self._ran:  # ran, its audit's end on its way
                done = self._ran[call.wire.id][0]
            if done is not None:
                text = self._clean(done.result.text)
            elif call.wire.id in self._open_calls:
                text = f"tool call stopped: {why} (it had started: it may have taken effect)"
            else:
                text = f"tool call not run: {why}"
            entries.append(self._result_entry(call, text))
        self._round = []
        return tuple(entries)

    async def _cut_short(
        self, call: _Call, failure: CallFailure, fences: list[FencedError]
    ) -> CoreOutcome:
        """The outcome of a call its round did not see end (a fence its audit met goes to
        `fences`, raised once the round is recorded)."""
        if (ran := self._ran.pop(call.wire.id, None)) is not None:
            # It ran, and only the wait for its audit's end was cut: what it did is what the
            # model hears (told "timed out", it sent again a message it had sent), and that
            # end is recorded.
            outcome, ending = ran
            try:
                await asyncio.shield(ending)
            except FencedError as exc:
                fences.append(exc)
            return outcome
        text = failure.describe()
        if isinstance(failure.error, BrokerUnavailableError):
            # The broker may have applied it, its answers lost: "failed", the model would
            # make it again (a message sent twice) once the history has this result.
            text = f"tool call outcome unknown: {failure.error}"
        started = call.wire.id in self._open_calls
        if started and failure.reason != "cancelled":
            text += " (it had started: it may have taken effect; check before doing it again)"
        outcome = CoreOutcome(ToolResult(text, _FAILED[failure.reason]))
        if started:  # started, never finished: say how
            await self._audit_end(call, outcome)
        return outcome

    def _allowed_seconds(self, call: _Call) -> float:
        """The time `call` may take by limits of its own: the tool's (a command's timeout),
        and the wait for its approval — asked a second time when nobody decided the first."""
        if call.problem or call.tool is None or call.args is None:
            return 0.0
        policy = tool_policy(self.spec, call.tool)
        if policy is ToolPolicy.DENY:
            return 0.0
        waits = 2 * self._config.approval_wait_seconds if policy is ToolPolicy.ASK else 0.0
        return self._toolbox.allowed_seconds(call.tool, call.args) + waits

    async def _run_call(self, call: _Call) -> CoreOutcome:
        digest = arguments_digest(call.wire.arguments)  # printable: UTF-8
        # A call the model gave no name is audited too (the start takes no empty name): no
        # call the model made goes unrecorded, even one that cannot run.
        tool = call.tool or call.wire.name or UNNAMED_TOOL
        start = ToolCallStart(
            call_id=call.wire.id,
            tool=tool[:200],
            arguments_digest=digest,
            arguments_size=len(call.wire.arguments.encode()),
            read_only=call.tool is not None and self._toolbox.read_only(call.tool),
        )
        # Open from before its start is asked for: a start whose answer is lost (or that the
        # wall clock cuts) may be recorded all the same, and without an end it would show as
        # running for ever.
        self._open_calls[call.wire.id] = time.monotonic()
        try:
            await self._broker.start_call(start)
        except BrokerError as exc:
            if isinstance(exc, FencedError):
                raise
            self._open_calls.pop(call.wire.id, None)  # refused: nothing to end
            # No call runs unaudited; and a start refused (the activation's tool calls spent)
            # is refused for every call after it: the activation ends, saying why.
            raise StartRefusedError(exc.status, exc.detail) from exc
        self._live.event("tool_progress", tool, call_id=call.wire.id, phase="started")
        outcome = await self._execute(call, digest)
        # It ran: its audit's end goes on being sent whatever cuts the wait for it (the
        # round's time limit, a stop), and the round reads what it did (`_ran`). Cut with
        # the wait, no end was recorded (the call showed running for ever) and the model
        # heard that a call which had done its work timed out.
        ending = asyncio.ensure_future(self._audit_end(call, outcome))
        self._ran[call.wire.id] = (outcome, ending)
        duration_ms = await asyncio.shield(ending)
        del self._ran[call.wire.id]
        self._live.event(
            "tool_progress",
            tool,
            call_id=call.wire.id,
            phase="finished",
            status=outcome.result.status,
            duration_ms=duration_ms,
        )
        return outcome

    async def end_open_calls(self, why: str, status: Status = "timeout") -> None:
        """The audit's end of the calls the activation's wall-clock limit (or a stop, or a
        fault) stopped mid-round: the round was cancelled before it could record them, and a
        call without an end shows as running for ever. Bounded: the output is the one call
        that must go."""
        stopped = CoreOutcome(ToolResult(why, status))
        try:
            async with asyncio.timeout(END_OPEN_CALLS_SECONDS):
                for _, ending in list(self._ran.values()):  # ran, their ends on their way
                    await asyncio.shield(ending)
                for call_id in list(self._open_calls):
                    await self._audit_end(
                        _Call(-1, WireCall(call_id, "", ""), None, None, None), stopped
                    )
        except TimeoutError:
            log("audit.finish_failed", calls=len(self._open_calls), error="out of time")

    async def _audit_end(self, call: _Call, outcome: CoreOutcome) -> int:
        """The audit's end of a started call (also of one its round stopped, or that raised:
        without an end it would show as running for ever); its duration in ms. A failure to
        record it keeps the result (a fence still ends the activation)."""
        duration_ms = int((time.monotonic() - self._open_calls.pop(call.wire.id)) * 1000)
        # A tool's text may hold lone surrogates (a file name that is not UTF-8): the digest
        # must not fail on them, or the finish record would never be sent.
        body = outcome.result.text.encode("utf-8", "surrogatepass")
        try:
            await self._finish_call(call, outcome, body, duration_ms)
        except BrokerError as exc:
            if isinstance(exc, FencedError):
                raise
            log("audit.finish_failed", call_id=call.wire.id, error=str(exc))
        except BrokerUnavailableError as exc:
            log("audit.finish_failed", call_id=call.wire.id, error=str(exc))
        return duration_ms

    async def _finish_call(
        self, call: _Call, outcome: CoreOutcome, body: bytes, duration_ms: int
    ) -> None:
        # Redacted before it is cut, so no secret survives even in part: the audit record is
        # durable and shown to the project's members.
        error = self._clean(outcome.result.text)[:2_000] if outcome.result.is_error else ""
        await self._broker.finish_call(
            ToolCallFinish(
                call_id=call.wire.id,
                status=outcome.result.status,
                result_digest=hashlib.sha256(body).hexdigest(),
                result_size=len(body),
                duration_ms=duration_ms,
                error=error,
            )
        )

    async def _execute(self, call: _Call, digest: str) -> CoreOutcome:
        if call.problem or call.tool is None or call.args is None:
            return CoreOutcome(ToolResult(call.problem or "cannot run", "error"))
        policy = tool_policy(self.spec, call.tool)
        if policy is ToolPolicy.DENY:
            return CoreOutcome(
                ToolResult(f"{call.tool} is denied by this agent's policy", "denied")
            )
        if policy is ToolPolicy.ASK:
            approval = await self._toolbox.core.approval(
                call.tool, call.wire.arguments, digest, self._config.approval_wait_seconds
            )
            if approval.result.status != "ok" or approval.waiting_for:
                return approval
            # The broker checks the approval again for the tools whose effect it makes.
            return await self._toolbox.run(call.tool, call.args, call.wire.id, call.wire.arguments)
        return await self._toolbox.run(call.tool, call.args, call.wire.id)

    def _clean(self, text: str) -> str:
        """A tool's result as the model, the history and the log may see it: the sandbox's
        secrets (token, provider keys) replaced, made valid UTF-8, and cut to what a history
        entry holds."""
        text = printable(text)
        for secret in self._secrets:
            text = text.replace(secret, "[redacted]")
        if self._secrets:
            text = redact_cut_edges(text, self._secrets)
        if len(text) > MAX_RESULT_CHARS:
            omitted = len(text) - MAX_RESULT_CHARS
            text = f"{text[:MAX_RESULT_CHARS]}\n[... {omitted} characters omitted]"
        return text

    # -- history ---------------------------------------------------------------------------
    def _push(self, message: Message, entry_id: str | None) -> None:
        self._messages.append(message)
        self._entry_ids.append(entry_id)

    def _assistant_entry(self, turn: ModelTurn) -> HistoryEntryIn:
        """The turn in the loop's messages, and its history entry to send."""
        entry_id = new_id()
        message: Message = {"role": "assistant", "content": turn.text or None}
        if turn.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in turn.tool_calls
            ]
        self._push(message, entry_id)
        kept = _within_one_message(
            turn.text, [_kept_arguments(c.arguments) for c in turn.tool_calls]
        )
        return HistoryEntryIn(
            message_id=entry_id,
            role="assistant",
            text=turn.text,
            tool_calls=tuple(
                HistoryToolCallIn(
                    id=c.id,
                    name=(self._toolbox.canonical(c.name) or c.name)[:200],
                    arguments=arguments,
                )
                for c, arguments in zip(turn.tool_calls, kept, strict=True)
            ),
        )

    async def _take_signals(self, signals: Sequence[SignalSpec], in_history: set[str]) -> None:
        """Signals become user messages; a message signal whose message ends the history
        already (`in_history`: after all the agent said) is not repeated, and only what is
        not in the session's log yet (non-message signals) is appended to it. A message
        posted while the last activation wrote its answer is in the log before that answer:
        it comes again at the end, or it looked answered (and the conversation ended with
        the agent's turn)."""
        entries: list[HistoryEntryIn] = []
        for signal in signals:
            if signal.id in self._received:
                continue
            self._received.append(signal.id)
            if signal.message_id and signal.message_id in in_history:
                continue
            if signal.payload.get("pending_action_id") in self._toolbox.core.answered:
                continue  # its answer came back as the tool's result already
            text = render_signal(signal)
            if signal.message_id and signal.text:
                if signal.message_id in self._entry_ids:  # where the log put it, too early
                    again = f"{SENT_WHILE_ANSWERING} {text}"
                    self._push({"role": "user", "content": again}, None)
                else:
                    self._push({"role": "user", "content": text}, signal.message_id)
                continue  # the message is in the session's log already
            entry_id = derived_id("signal.entry", signal.id)
            if entry_id in self._entry_ids:
                # An earlier attempt of this activation recorded it: in the history in its
                # place already, and pushed again it read as a second reminder of the work.
                continue
            self._push({"role": "user", "content": text}, entry_id)
            entries.append(HistoryEntryIn(message_id=entry_id, role="user", text=text))
        if entries:
            await self._broker.append_history(entries)

    def _failed(self, cls: FailureClass) -> None:
        self._failures[cls.value] = self._failures.get(cls.value, 0) + 1

    def usage(self) -> dict[str, Any]:
        """What the activation spent so far (also for an ending the loop did not reach)."""
        return {
            **self._usage,
            "model_calls": self.model_calls,
            "compactions": self.compactions,
            "prompt_hash": self.prompt.hash,
            "model": self._models[self._model_index].spec.name,
        } | ({"model_failures": dict(self._failures)} if self._failures else {})

    def _ending(self, reason: Reason, text: str, *unsent: HistoryEntryIn) -> Ending:
        return Ending(reason, text, self.usage(), history=unsent)


# Where the built-in tools cut their output (shell.exec's omitted middle, web.fetch's cap,
# file.read's over-long line, file.search's clipped line). A cut can halve a secret, and the
# halves no longer match it.


def _entry_text(text: str) -> str:
    """A reply's text as a history entry (and a compaction marker) holds it: valid UTF-8, no
    NUL, at most `MAX_ENTRY_CHARS` (`printable`'s escapes may lengthen a text at the model
    client's bound)."""
    return printable(text)[:MAX_ENTRY_CHARS]


def _cut_off(call: WireCall) -> bool:
    """Whether the output cap cut `call`'s arguments short (they do not parse)."""
    return decode_arguments(call.arguments)[1] is not None


_CUT = re.compile(
    r"(\n\[\.\.\. \d+ bytes omitted \.\.\.\]\n|\n\[truncated at \d+ bytes\]|\n\[line \d+ cut\]"
    r"| \[\.\.\.\](?=\n|$))"  # file.search's clipped line
)
_FRAGMENT_MIN = 3  # shorter fragments reveal next to nothing and would hit ordinary text


def redact_cut_edges(text: str, secrets: Sequence[str]) -> str:
    """Redact what is left of a secret at a cut: a prefix of one just before a cut marker,
    a suffix of one just after it."""
    pieces = _CUT.split(text)  # text, marker, text, marker, ..., text
    for i in range(0, len(pieces) - 1, 2):
        pieces[i] = _trim(pieces[i], secrets, at_end=True)
        pieces[i + 2] = _trim(pieces[i + 2], secrets, at_end=False)
    return "".join(pieces)


def _trim(piece: str, secrets: Sequence[str], *, at_end: bool) -> str:
    longest = 0
    for secret in secrets:
        for k in range(min(len(secret), len(piece)), _FRAGMENT_MIN - 1, -1):
            if piece.endswith(secret[:k]) if at_end else piece.startswith(secret[-k:]):
                longest = max(longest, k)
                break
    if not longest:
        return piece
    return piece[:-longest] + "[redacted]" if at_end else "[redacted]" + piece[longest:]


INVALID_ARGUMENTS_KEPT_CHARS = 2_000


def _kept_arguments(arguments: str) -> str:
    """A call's arguments as its history entry keeps them (1 M characters at most): longer
    ones stand in as a JSON object holding their start and size — cut, they were no JSON at
    all, and the session's next activations sent them back to providers that refuse that."""
    if len(arguments) <= MAX_ENTRY_CHARS:
        return arguments
    return _stand_in(arguments)


def _stand_in(arguments: str) -> str:
    kept = arguments[:INVALID_ARGUMENTS_KEPT_CHARS]
    return json.dumps({"truncated_arguments": kept, "characters": len(arguments)})


def _within_one_message(text: str, arguments: list[str]) -> list[str]:
    """`arguments` with the largest standing in (`_stand_in`) until the entry fits one message
    of the platform's bus, as JSON (`MAX_ENTRY_BYTES`): a reply of several large file writes
    (each under the 1 M characters a call keeps; quotes and non-ASCII text making the bytes
    more) could not be recorded at all — the history refused, the activation failed, and its
    retry likely again. The calls themselves run with what the model wrote."""
    sizes = [json_size(a) for a in arguments]
    total = json_size(text) + sum(sizes)
    kept = list(arguments)
    while total > MAX_ENTRY_BYTES:
        largest = max(range(len(sizes)), key=sizes.__getitem__, default=None)
        if largest is None or sizes[largest] <= STAND_IN_BYTES:
            break  # the text (at most 1 M characters) fits a message by itself
        kept[largest] = _stand_in(kept[largest])
        total -= sizes[largest]
        sizes[largest] = json_size(kept[largest])
        total += sizes[largest]
    return kept


def _as_sent_back(call: _Call) -> WireCall:
    """The call as the conversation (and the history) keeps it. Arguments that are no JSON
    object stand in as one holding their start: providers and gateways that parse a
    conversation's arguments (vLLM's chat templates, adapters to other APIs) refused every
    later request of the activation, and of the session's next ones, for one bad reply. An
    empty name stands in as `unnamed_tool`, for the same reason: OpenAI and Gemini refuse a
    conversation holding a call named `""` (400)."""
    name = _sendable_name(call.wire.name)
    if call.args is not None:
        return (
            call.wire
            if name == call.wire.name
            else WireCall(call.wire.id, name, call.wire.arguments)
        )
    kept = call.wire.arguments[:INVALID_ARGUMENTS_KEPT_CHARS]
    return WireCall(call.wire.id, name, json.dumps({"invalid_arguments": kept}))


def _sendable_name(name: str) -> str:
    """A call's name as providers take it back (`^[A-Za-z0-9_-]{1,64}$`, OpenAI's and
    Gemini's rule for tool names): other characters as `_`, cut to 64; none at all as
    `unnamed_tool`."""
    if _SENDABLE_NAME.fullmatch(name):
        return name
    return _NOT_SENDABLE.sub("_", name.strip())[:64] or UNNAMED_TOOL_SENT_BACK


def decode_arguments(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """A call's arguments as a JSON object, or why they are not one. Never raises: whatever
    the model sent becomes an error result for that call, not a failed activation."""
    if len(text) > MAX_ARGUMENT_CHARS:
        return None, f"the arguments are {len(text)} characters; the limit is {MAX_ARGUMENT_CHARS}"
    try:
        parsed = json.loads(text or "{}")
    except RecursionError:
        return None, f"the arguments are nested more than {MAX_ARGUMENT_DEPTH} levels deep"
    except ValueError as exc:  # malformed JSON, and integers over Python's digit limit
        return None, f"the arguments are not valid JSON: {exc}"
    if not isinstance(parsed, dict):
        return None, "the arguments must be a JSON object"
    if _deeper_than(parsed, MAX_ARGUMENT_DEPTH):
        return None, f"the arguments are nested more than {MAX_ARGUMENT_DEPTH} levels deep"
    return parsed, None


def _deeper_than(value: object, limit: int) -> bool:
    """Whether containers nest more than `limit` levels (iterative: no recursion limit)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        )
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def tool_policy(spec: RunnerActivationInput, tool: str) -> ToolPolicy:
    """The agent's policy for `tool` (canonical name): `effective_policy`'s rule."""
    return effective_policy(spec.permissions, spec.default_permission, tool)


def workspace_path(spec: RunnerActivationInput) -> Path:
    return Path(spec.workspace)


def _after_the_agent(spec: RunnerActivationInput) -> set[str]:
    """The ids of the history's entries after the last the agent wrote (its answer or a tool
    result): messages it has not answered, in their place already. What an earlier attempt
    of this retry wrote (started with the same signals) does not end them: the message they
    were started with stands before that work, unanswered still, and pushed again at the end
    it read as a second message."""
    tail: set[str] = set()
    attempts = set(spec.activation.earlier_attempts)
    for entry in reversed(spec.history):
        if entry.role in {"assistant", "tool"}:
            if entry.activation_id is not None and entry.activation_id in attempts:
                continue
            break
        if entry.id:
            tail.add(entry.id)
    return tail
