"""`suzumio chat SESSION TEXT`: send a message to a session and follow the agent's answer.

The message is posted (`POST /v1/sessions/{id}/messages`); then the session's timeline
(`GET /v1/sessions/{id}/stream`, SSE, from the message's log position) says which activations
were handed the message's signal (`session.signals_delivered`), and their live output is
printed as it comes: text as the model writes it, a line per tool call. An activation's end is
not on the session's timeline: each one handed the signal is asked for (`GET
/v1/activations/{id}`) until it ended.

- One of them completed: its answer has been shown as its live text came (else its recorded
  output is shown now) and the command exits 0 — or 4 if it ran out of model calls (reason
  `budget_exhausted`: its answer is the summary it was given a last call to write, and the
  work may be unfinished; a script must not take that for success).
- One failed, timed out or was cancelled: that is said, and the command goes on waiting — the
  scheduler retries the signal within its budget, handing it to the next activation.
- The signal was closed (`session.signal_closed`: its retry budget spent, a non-retryable
  failure, a cancel): the outcome and reason are said, exit 1.
- Nothing of that within `--timeout` seconds: said, exit 1 (the work may still go on).
- What those activations wait on (a question, an approval of a tool call under the `ask`
  policy, files) is said once each; interactive (stdin a terminal, or `--interactive`), the
  answer is typed right there and sent, and the activation goes on. One that ended waiting
  for an answer nobody gave in time (`completed`, reason `waiting`) exits 3: its next
  activation starts when the answer comes (`suzumio pending reply`).

A refusal of the post or of the stream (no such session, no access) is one line, exit 1. The
stream is read by `timeline`, which resumes it when the gateway asks for that.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sys
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any
from urllib.parse import quote

import httpx
import typer
from rich.console import Console

from suzumio.cli import pending, rest
from suzumio.cli.failures import fail, first_line, redact
from suzumio.cli.timeline import StreamRefusedError, detail, read_timeline

console = Console(highlight=False, soft_wrap=True)  # one line per line, however narrow
TERMINAL = frozenset({"completed", "failed", "cancelled", "timed_out"})
POLL_SECONDS = 0.25
SETTLE_SECONDS = 2.0  # for the stream to bring a completed activation's last words
WAITING = 3  # the activation ended waiting for a person (as the runner's exit 3 says)
BUDGET_EXHAUSTED = 4  # it ran out of model calls, its answer a summary (the runner's exit 4)
PENDING_EVERY = 4  # polls between looks at what the activations wait on (~1 s)
EARLY_ACTIVATIONS = 16  # activations whose live chunks are kept before one is handed the message
EARLY_CHUNKS = 2_000  # chunks kept of each
SHOWN_TAIL = 4_096  # characters of each activation's live text kept, to compare its output with
PROMPT_ASKS_EVERY = 2  # looks: how often the action is read again while its prompt waits
PROMPT_LOOK_SECONDS = 1.0  # while a prompt waits for its answer: how often the work is looked at
MAX_ANSWER_BYTES = 1 << 20  # a longer line is taken as it is
SILENT_STREAM_SECONDS = 45.0  # three of the gateway's keep-alive intervals
TRANSIENT = frozenset({502, 503, 504})  # a proxy or gateway between restarts: asked again


@dataclass
class Conversation:
    """What the timeline told so far of the message's work."""

    session_id: str
    signal_id: str
    activations: dict[str, str] = field(default_factory=dict)  # handed the signal: status
    asked: set[str] = field(default_factory=set)  # pending actions said
    # Pending actions answered here → their activation: the answer's own signal (the session
    # records one per answer) is followed as the message's is.
    answered: dict[str, str] = field(default_factory=dict)
    resume_of: dict[str, str] = field(default_factory=dict)  # such an action → its signal
    signals: set[str] = field(default_factory=set)  # the message's, and those answers'
    delivered: dict[str, str] = field(default_factory=dict)  # such a signal → its activation
    shown: set[str] = field(default_factory=set)  # activations whose live text was printed
    # The end of each one's live text printed (`SHOWN_TAIL` characters): what its recorded
    # output is compared with, so an answer already shown is not printed again.
    tails: dict[str, str] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)  # their final entry (no tool calls) came
    closed: tuple[str, str] | None = None  # the signal's outcome and reason, once closed
    mid_line: bool = False  # live text was printed without its line's end
    entry_came: asyncio.Event = field(default_factory=asyncio.Event)  # a final entry did
    # Live chunks of activations not (yet) known to be handed a followed signal: the live
    # stream comes before the log's events on the timeline, so an activation's first words
    # may come before the event that hands it the message.
    early: OrderedDict[str, list[dict[str, Any]]] = field(default_factory=OrderedDict)
    # Activations requested to start with a followed signal: their early chunks are theirs.
    # One handed the message while it ran (a handover) said what it said before about
    # earlier work — printed, it read as the start of this message's answer.
    started_for: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.signals.add(self.signal_id)

    def live(self) -> bool:
        """Whether an activation handed the message may still run."""
        return any(status not in TERMINAL for status in self.activations.values())

    def end_line(self) -> None:
        if self.mid_line:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self.mid_line = False

    def say(self, text: str, style: str = "dim") -> None:
        self.end_line()
        console.print(text, style=style, markup=False)

    def take(self, event: str, data: dict[str, Any]) -> None:
        """One timeline item (`event`: the log event's type, or `live`)."""
        if event == "live":
            self._live(data)
            return
        body = data.get("data")
        if not isinstance(body, dict):
            return
        handed = body.get("signal_ids")
        if event == "session.signals_delivered" and self.signals.intersection(handed or ()):
            activation_id = str(body.get("activation_id"))
            for signal_id in self.signals.intersection(handed or ()):
                self.delivered[signal_id] = activation_id
            self._handed(activation_id)
        elif event == "session.activation_requested" and self.signals.intersection(handed or ()):
            self.started_for.add(str(body.get("activation_id")))
        elif event == "session.signal_closed" and body.get("signal_id") in self.signals:
            self.closed = (str(body.get("outcome")), str(body.get("reason") or ""))
        elif event == "session.signal_recorded":
            payload = body.get("payload")
            action_id = payload.get("pending_action_id") if isinstance(payload, dict) else None
            if action_id in self.answered:
                self.signals.add(str(body.get("signal_id")))
                self.resume_of[str(action_id)] = str(body.get("signal_id"))
        elif event == "session.message_appended" and body.get("role") == "assistant":
            self._entry(body)

    def answer_to_come(self, activation_id: str) -> bool:
        """Whether an answer given here to what `activation_id` waited on has not reached it:
        it came after the activation stopped waiting, and starts the next one."""
        return any(
            asked_by == activation_id
            and self.delivered.get(self.resume_of.get(action_id, "")) != activation_id
            for action_id, asked_by in self.answered.items()
        )

    def _handed(self, activation_id: str) -> None:
        if activation_id in self.activations:
            return
        self.activations[activation_id] = "handed"
        early = self.early.pop(activation_id, ())
        if activation_id in self.started_for:
            for chunk in early:
                self._live(chunk)

    def _live(self, chunk: dict[str, Any]) -> None:
        activation_id = chunk.get("activation_id")
        if not isinstance(activation_id, str):
            return
        if activation_id not in self.activations:
            self._keep_early(activation_id, chunk)
            return
        text, data = str(chunk.get("text") or ""), chunk.get("data") or {}
        match chunk.get("kind"):
            case "text" if text:
                sys.stdout.write(text)
                sys.stdout.flush()
                self.mid_line = True
                self.shown.add(activation_id)
                self.tails[activation_id] = (self.tails.get(activation_id, "") + text)[-SHOWN_TAIL:]
            case "tool_progress" if data.get("phase") == "started":
                self.say(f"· {text}")
            case "state" if data.get("discard"):
                self.say(f"[{text}]")

    def _keep_early(self, activation_id: str, chunk: dict[str, Any]) -> None:
        kept = self.early.get(activation_id)
        if kept is None:
            if len(self.early) >= EARLY_ACTIVATIONS:  # the oldest one's were someone else's
                self.early.popitem(last=False)
            kept = self.early[activation_id] = []
        if len(kept) < EARLY_CHUNKS:
            kept.append(chunk)

    def _entry(self, body: dict[str, Any]) -> None:
        # The words are printed from the live text only: the two kinds come in no fixed order,
        # so printing entries too would print some twice. An activation whose live text did
        # not come has its recorded output printed when it completed (`_settle`).
        activation_id = body.get("activation_id")
        if activation_id in self.activations and not body.get("tool_calls"):
            self.finished.add(activation_id)
            self.entry_came.set()


def chat_command(
    session_id: Annotated[str, typer.Argument(help="the session's id")],
    text: Annotated[str, typer.Argument(help="the message")],
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="follow the answer, or only send")
    ] = True,
    timeout: Annotated[
        float, typer.Option(min=1, help="seconds to wait for the answer before giving up")
    ] = 600,
    interactive: Annotated[
        bool | None,
        typer.Option(
            "--interactive/--no-interactive",
            help="answer the agent's questions and approvals here, from stdin (default: when "
            "stdin is a terminal)",
        ),
    ] = None,
    api: rest.ApiUrl = rest.API_URL,
    key: rest.ApiKey = None,
) -> None:
    """Send a message to a session and print the agent's answer as it is written (exit 0
    once an activation handed the message completed; 1 if the message's work failed for
    good, or nothing ended within --timeout; 3 if the agent ended waiting for an answer
    nobody gave in time: `suzumio pending list SESSION`)."""
    headers = rest.key_headers(api, key)
    path = f"/v1/sessions/{quote(session_id, safe='')}/messages"
    posted, response = rest.post(api, path, 201, headers=headers, json={"text": text})
    signal_id = posted.get("signal_id") if posted else None
    position = posted.get("position") if posted else None
    if not isinstance(signal_id, str) or not isinstance(position, int) or position < 1:
        fail(f"the API at {redact(api)} answered 201 without a signal: {rest.short(response)}")
    if not wait:
        console.print(f"message sent (signal {signal_id})", style="green", markup=False)
        return
    conversation = Conversation(session_id, signal_id)
    on_terminal = sys.stdin is not None and sys.stdin.isatty()  # None: stdin closed (`<&-`)
    asking = on_terminal if interactive is None else interactive
    try:
        code = asyncio.run(follow(api, headers, position, conversation, timeout, asking))
    except KeyboardInterrupt:
        conversation.end_line()
        raise typer.Exit(130) from None
    raise typer.Exit(code)


async def follow(
    api: str,
    headers: dict[str, str],
    position: int,
    conversation: Conversation,
    timeout: float,
    interactive: bool = False,
) -> int:
    """Follow the message's work to its end; the exit code."""
    base = api.rstrip("/")
    # The gateway says something at least every 15 s on a quiet stream (a keep-alive): one
    # that says nothing much longer is taken for cut off (a NAT or a host gone, no reset
    # ever coming) and read again from its last cursor.
    limits = httpx.Timeout(30, read=SILENT_STREAM_SECONDS)
    session_id = conversation.session_id
    async with (
        httpx.AsyncClient(base_url=base, headers=headers, timeout=limits) as client,
        _stdin_lines(interactive) as answers,
    ):
        reading = asyncio.create_task(
            read_timeline(client, session_id, f"{position - 1}.0", conversation)
        )
        try:
            async with asyncio.timeout(timeout):
                return await _until_ended(client, conversation, reading, answers)
        except TimeoutError:
            conversation.say(
                f"no answer within {timeout:g} s; the work may still go on "
                f"(GET /v1/sessions/{session_id}/activations)",
                style="red",
            )
            return 1
        except (httpx.HTTPError, StreamRefusedError) as exc:
            conversation.say(
                f"could not follow the answer at {redact(api)}: {first_line(exc)}", style="red"
            )
            return 1
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError, StreamRefusedError):
                await reading


class StdinLines:
    """Stdin's lines, read as the loop says stdin is readable. Its blocking mode stays as it
    is: in a shell stdin is the same open file as the terminal's output, and made
    non-blocking, a write of the live text to a full terminal (a slow link, Ctrl-S) raised
    `BlockingIOError` and ended the chat."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = bytearray()
        self._ended = False
        self._paused = False  # a full buffer: not read on until a line is taken
        self._changed = asyncio.Event()

    def start(self) -> None:
        """Read as the loop says stdin is readable.

        Raises:
            OSError: stdin is nothing the loop can wait on (a regular file, /dev/null).
        """
        asyncio.get_running_loop().add_reader(self._fd, self.readable)

    def stop(self) -> None:
        if not self._ended and not self._paused:
            asyncio.get_running_loop().remove_reader(self._fd)

    def readable(self) -> None:
        try:
            data = os.read(self._fd, 65_536)  # readable: returns at once, blocking or not
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            self._buffer += data
            if len(self._buffer) >= MAX_ANSWER_BYTES:  # `yes | suzumio chat`: hold on
                self._paused = True
                asyncio.get_running_loop().remove_reader(self._fd)
        else:
            self._ended = True
            asyncio.get_running_loop().remove_reader(self._fd)
        self._changed.set()

    async def readline(self) -> bytes:
        """The next line (b"" once stdin ended). Cancelled, it loses nothing."""
        while True:
            end = self._buffer.find(b"\n")
            if end < 0 and (self._ended or len(self._buffer) >= MAX_ANSWER_BYTES):
                end = len(self._buffer) - 1
            if end >= 0 or self._ended:
                line = bytes(self._buffer[: end + 1])
                del self._buffer[: end + 1]
                if self._paused and len(self._buffer) < MAX_ANSWER_BYTES:
                    self._paused = False
                    self.start()
                return line
            self._changed.clear()
            await self._changed.wait()


@contextlib.asynccontextmanager
async def _stdin_lines(wanted: bool) -> AsyncIterator[StdinLines | None]:
    """Stdin's lines (None when not wanted, or when stdin is closed or something the loop
    cannot wait on: a regular file, /dev/null)."""
    if not wanted or sys.stdin is None:
        yield None
        return
    try:
        lines = StdinLines(sys.stdin.fileno())
        lines.start()
    except (OSError, ValueError):  # epoll refuses regular files and /dev/null (EPERM)
        yield None
        return
    try:
        yield lines
    finally:
        lines.stop()


async def _until_ended(
    client: httpx.AsyncClient,
    conversation: Conversation,
    reading: asyncio.Task[None],
    answers: StdinLines | None,
) -> int:
    rounds = 0
    while True:
        if reading.done():
            reading.result()  # its refusal, else it ended by itself: nothing more will come
            raise StreamRefusedError("the session's stream ended")
        if conversation.closed is not None:
            outcome, reason = conversation.closed
            conversation.say(f"the message's work ended {outcome}: {reason}", style="red")
            return 1
        for activation_id, status in list(conversation.activations.items()):
            if status in TERMINAL:
                continue
            row = await _activation(client, activation_id)
            if row is None or row.get("status") not in TERMINAL:
                continue
            conversation.activations[activation_id] = str(row["status"])
            code = await _ended(conversation, activation_id, row)
            if code is not None:
                return code
        rounds += 1
        if rounds % PENDING_EVERY == 0 and conversation.live():
            await _pending(client, conversation, answers)
        await asyncio.sleep(POLL_SECONDS)


async def _ended(conversation: Conversation, activation_id: str, row: dict[str, Any]) -> int | None:
    """What an activation handed the message ending says: the exit code, or None to go on
    (the scheduler retries a failed one; an answer given here starts the next one)."""
    if row["status"] != "completed":
        why = row.get("end_reason") or "no reason given"
        conversation.say(f"[activation {activation_id} {row['status']}: {why}]")
        return None
    await _settle(conversation, activation_id, row)
    if row.get("end_reason") == "budget_exhausted":
        conversation.say(
            f"[activation {activation_id} ran out of model calls: what it said is its summary "
            "so far, the work may be unfinished]"
        )
        return BUDGET_EXHAUSTED
    if row.get("end_reason") != "waiting":
        return 0
    if conversation.answer_to_come(activation_id):
        # Answered here after it stopped waiting: the answer's signal starts the next
        # activation, which is followed as this one was.
        conversation.say("[the answer goes to the agent's next activation]")
        return None
    conversation.say(
        "[the agent waits for an answer; its next activation starts when it comes: "
        f"suzumio pending list {conversation.session_id}]"
    )
    return WAITING


async def _open_actions(client: httpx.AsyncClient, path: str) -> list[Any]:
    """The session's open pending actions, every page of them (a gateway from before the
    pages answers a plain list, of every status); what could not be read is looked at again
    next time."""
    found: list[Any] = []
    params: dict[str, str | int] = {"status": "open", "limit": 200}
    while True:
        try:
            response = await client.get(path, params=params)
        except httpx.TransportError:  # a gateway restarting: looked at again next time
            return found
        try:
            body = response.json() if response.status_code == 200 else None
        except ValueError:  # not JSON (a proxy's error page)
            return found
        if isinstance(body, list):
            return found + body
        if not isinstance(body, dict) or not isinstance(body.get("items"), list):
            return found
        found += body["items"]
        following = body.get("next_cursor")
        if not isinstance(following, str) or not following:
            return found
        params["cursor"] = following


async def _pending(
    client: httpx.AsyncClient, conversation: Conversation, answers: StdinLines | None
) -> None:
    """What the message's activations wait on: said once each, and answered here when the
    command is interactive."""
    path = f"/v1/sessions/{quote(conversation.session_id, safe='')}/pending-actions"
    listed = await _open_actions(client, path)
    for action in listed:
        if (
            not isinstance(action, dict)
            or action.get("status") != "open"
            or action.get("activation_id") not in conversation.activations
            or action.get("id") in conversation.asked
        ):
            continue
        action_id = str(action.get("id"))
        conversation.asked.add(action_id)
        conversation.say(pending.describe(action), style="bold")
        still_open = functools.partial(_still_open, client, action_id)
        reply = (
            await _answer(action, answers, conversation, still_open)
            if answers is not None
            else None
        )
        if reply is None:
            if conversation.closed is None and not await still_open():
                conversation.say("  answered elsewhere, or no longer open")
                continue
            conversation.say(f"  reply: {pending.how_to_reply(action)}")
            continue
        # Before the answer is sent: its signal may be on the timeline before the reply is.
        conversation.answered[action_id] = str(action["activation_id"])
        answered = await _reply(client, action_id, reply)
        if answered is None or answered.status_code != 200:
            del conversation.answered[action_id]
        if answered is not None and answered.status_code == 422:
            conversation.asked.discard(action_id)  # an answer it cannot take: asked again
        if answered is None:
            said = f"the answer could not be sent; reply: {pending.how_to_reply(action)}"
        else:
            said = "answered" if answered.status_code == 200 else detail(answered)
        conversation.say(f"  {said}")


async def _still_open(client: httpx.AsyncClient, action_id: str) -> bool:
    """Whether the action still waits for an answer (yes when that cannot be read now)."""
    try:
        response = await client.get(f"/v1/pending-actions/{quote(action_id, safe='')}")
    except httpx.TransportError:
        return True
    body = rest.json_object(response) if response.status_code == 200 else None
    return body is None or body.get("status") == "open"


async def _reply(
    client: httpx.AsyncClient, action_id: str, reply: dict[str, object]
) -> httpx.Response | None:
    """The reply sent, again while the connection fails or the gateway is away, under one
    `Idempotency-Key` (an attempt that reached it is answered as it was, not done twice);
    None when it could not be sent at all."""
    path = f"/v1/pending-actions/{quote(action_id, safe='')}/reply"
    headers = {rest.IDEMPOTENCY_HEADER: f"cli-{uuid.uuid4().hex}"}
    for delay in (*rest.RETRY_DELAYS, None):
        try:
            response = await client.post(path, json=reply, headers=headers)
        except httpx.TransportError:
            response = None
        again = response is None or response.status_code in TRANSIENT
        # An attempt cut off may still be at work: the gateway's 409 says so, then answers.
        again = again or (response is not None and rest.still_in_progress(response))
        if not again:
            return response
        if delay is None:
            return response
        await asyncio.sleep(delay)
    raise AssertionError("unreachable: the last attempt returns")


async def _answer(
    action: dict[str, Any],
    lines: StdinLines,
    conversation: Conversation,
    still_open: Callable[[], Awaitable[bool]],
) -> dict[str, object] | None:
    """The reply typed for `action` (None: none can be typed, stdin ended, or while the
    prompt waited the message's work was closed or the action answered elsewhere)."""
    approval = action.get("kind") == "approval"
    if action.get("kind") == "artifact_request":
        return None
    while True:
        sys.stdout.write("  approve? [y/n] " if approval else "  your answer: ")
        sys.stdout.flush()
        line = await _typed(lines, conversation, still_open)
        if not line:
            sys.stdout.write("\n")
            return None
        text = line.decode(errors="replace").strip()
        if approval and text.lower() in {"y", "yes", "n", "no"}:
            return {"approved": text.lower().startswith("y")}
        if not approval and text:
            return {"answer": text}


async def _typed(
    lines: StdinLines, conversation: Conversation, still_open: Callable[[], Awaitable[bool]]
) -> bytes:
    """A line typed at the prompt; b"" when stdin ended, or meanwhile the message's signal
    was closed (a cancel: the timeline, read on, says so) or the action was answered
    elsewhere (`suzumio pending reply`, the API) or expired — its activation may end while
    nobody types, and the command would wait out its --timeout and say it failed."""
    looks = 0
    while conversation.closed is None:
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(lines.readline(), PROMPT_LOOK_SECONDS)
        looks += 1
        if looks % PROMPT_ASKS_EVERY == 0 and not await still_open():
            return b""
    return b""


async def _settle(conversation: Conversation, activation_id: str, row: dict[str, Any]) -> None:
    """A completed activation's last words: from the stream, which may lag the read model
    by a moment, else its recorded output."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(SETTLE_SECONDS):
            while activation_id not in conversation.finished:
                conversation.entry_came.clear()
                await conversation.entry_came.wait()
    # Its live text is its answer when the final entry came, or when it ends with the output
    # (the entry may lag behind): an activation that ended with `activation.complete` has
    # its result in its output only, never in live text.
    output = str(row.get("output_text") or "")
    shown = conversation.tails.get(activation_id, "").strip()
    told = activation_id in conversation.finished or (
        bool(shown) and shown.endswith(output.strip()[-SHOWN_TAIL:])
    )
    if output and not (activation_id in conversation.shown and told):
        conversation.say(output, style="")
    conversation.end_line()


async def _activation(client: httpx.AsyncClient, activation_id: str) -> dict[str, Any] | None:
    """The activation's row; None while the read model has not got it yet, or the gateway
    cannot be reached (a restart: the stream is read again from its cursor meanwhile)."""
    try:
        response = await client.get(f"/v1/activations/{quote(activation_id, safe='')}")
    except httpx.TransportError:
        return None  # asked again at the next poll, within --timeout
    if response.status_code == 404 or response.status_code in TRANSIENT:
        return None  # asked again at the next poll, within --timeout
    if response.status_code != 200:
        raise StreamRefusedError(f"{response.status_code}: {detail(response)}")
    return rest.json_object(response)
