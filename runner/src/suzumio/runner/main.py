"""`python -m suzumio.runner run`: one activation, from the input file to the output."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import sys
from collections.abc import Awaitable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

import orjson
from pydantic import ValidationError

from suzumio.contracts.broker import HistoryEntryIn, StreamBatch
from suzumio.contracts.runner import FileExchange, RunnerActivationInput, RunnerActivationOutput
from suzumio.runner import eventloop, exits, forkserver, strays
from suzumio.runner.agent import MAX_OUTPUT_CHARS, AgentLoop, Ending, ModelFailedError
from suzumio.runner.assets import bring_assets
from suzumio.runner.broker import (
    OUTPUT_RETRIES,
    BrokerClient,
    BrokerError,
    BrokerUnavailableError,
    FencedError,
)
from suzumio.runner.connections import Connections, broker_socket
from suzumio.runner.handover import fetch_inputs, send_outputs
from suzumio.runner.live import LiveStream
from suzumio.runner.log import context, keep_secret, log, redacted, tail
from suzumio.runner.log import secrets as log_secrets
from suzumio.runner.loop.failures import FailureClass
from suzumio.runner.model import ModelClient, endpoint_for, relayed_endpoint
from suzumio.runner.toolbox import Toolbox
from suzumio.runner.tools.base import Mount, ToolContext
from suzumio.runner.workfiles import ExchangeError

BROKER_TIMEOUT_SECONDS = 30.0
CUT_ROUND_SECONDS = 2.0  # a stopped round's results, within the stop's grace (3 s at least)
# Failures no retry of the activation would get past: the provider refused the content, the
# credentials or the model, for every model of the chain.
REFUSED_FOR_GOOD = frozenset({
    FailureClass.CONTENT_POLICY,
    FailureClass.AUTH,
    FailureClass.FORBIDDEN,
    FailureClass.BILLING,
    FailureClass.MODEL_NOT_FOUND,
})  # fmt: skip
# A resident runner's request line: a dispatch (at most a bus message, 64 MiB) as a JSON string
# inside JSON, escaped, with its environment.
MAX_REQUEST_LINE = 256 << 20
# What a shell command may see of the runner's environment: never the token or a key.
SHELL_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "TZ", "TERM")


def shell_env(env: Mapping[str, str], workspace: str) -> dict[str, str]:
    kept = {k: env[k] for k in SHELL_ENV_KEEP if k in env}
    kept.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    return {**kept, "HOME": workspace, "TMPDIR": f"{workspace}/.tmp"}


@dataclass
class Reported:
    """The exit code an activation's output was recorded with, once it was: a SIGTERM after
    that (a worker draining, a kill as the runner ends) ends the runner with it, not as
    terminated — else the orchestrator took a recorded answer for cancelled work, and
    retried it."""

    code: int | None = None


async def run_activation(
    spec: RunnerActivationInput,
    env: Mapping[str, str],
    kept: Connections | None = None,
    reported: Reported | None = None,
) -> int:
    """One activation, from its input to its output; the exit code. `kept`: the clients a
    resident runner keeps across its activations (else each is made here and closed)."""
    reported = reported if reported is not None else Reported()
    context.update(activation=spec.activation.id, session=spec.session.id, agent=spec.agent.id)
    secrets = [v for k, v in env.items() if k.endswith(("API_KEY", "_TOKEN", "_SECRET"))]
    log_secrets.clear()  # a resident runner's earlier activation's are not this one's
    keep_secret(spec.token, *secrets)
    workspace = Path(spec.workspace)
    (workspace / ".tmp").mkdir(parents=True, exist_ok=True)
    tool_ctx = ToolContext(
        workspace=workspace,
        mounts=tuple(Mount(Path(m.path), m.writable) for m in spec.mounts),
        allow_private_network=spec.allow_private_network,
        env=shell_env(env, spec.workspace),
    )
    timeout = BROKER_TIMEOUT_SECONDS
    retries = spec.runner.broker_retries
    socket = spec.controller_socket  # network `none`: the broker's socket is the only way out
    broker = BrokerClient(
        spec.controller_url,
        spec.token,
        timeout=timeout,
        transport=broker_socket(socket) if socket else None,
        http=kept.broker(spec.controller_url, timeout) if kept and not socket else None,
        retries=retries,
        output_retries=max(OUTPUT_RETRIES, retries),
    )
    chain = (spec.agent.model, *spec.agent.fallbacks)
    if socket:
        relayed = [relayed_endpoint(m, spec.controller_url, spec.token) for m in chain]
        models = [ModelClient(m, e, socket=socket) for m, e in zip(chain, relayed, strict=True)]
    else:
        models = [ModelClient(m, endpoint_for(m, env), kept=kept) for m in chain]
    live = LiveStream(broker)
    live.start()
    loop = AgentLoop(spec, broker, models, Toolbox(spec, broker, tool_ctx), live, secrets)
    code = exits.CRASHED
    try:
        ending, code = await _run_loop(spec, broker, loop, workspace)
        stopped = False
        if spec.files is not None and code != exits.INPUTS_UNAVAILABLE:
            stopped = not await _files_out(broker, live, workspace, spec.files)
        code = await _report(_final(broker, ending, live, code), reported)
        log("activation.ended", reason=ending.reason, exit_code=code, calls=loop.model_calls)
        if stopped:
            raise asyncio.CancelledError  # the stop takes effect, its output reported
    except FencedError as exc:
        log("activation.fenced", detail=exc.detail)
        code = exits.FENCED
    except BrokerUnavailableError as exc:
        log("activation.broker_unreachable", error=str(exc))
        code = exits.BROKER_UNREACHABLE
    finally:
        await live.close()
        for model in models:
            await model.close()
        await broker.aclose()
    return code


async def _files_out(
    broker: BrokerClient, live: LiveStream, workspace: Path, files: FileExchange
) -> bool:
    """What the activation left in `out/`, sent; False when a stop came meanwhile. The work
    is done then: the files not sent yet are dropped, and the output is still reported (as
    a stop during its report waits for it) — else a cancel or a drain that came while a large
    file went up lost the activation's answer, and the orchestrator took it for unfinished
    work, to be done again."""
    try:
        await live.close()  # the files may take a while: the live output goes first
        # What the commands left running ends first, as it has where the platform collects
        # `out/` after the runner exited: else a file it still writes would be sent
        # half-written, or change while it is sent.
        if ended := await strays.end_children():
            log("activation.strays_ended", count=ended)
        sent = await send_outputs(broker, workspace, files)
    except asyncio.CancelledError:
        log("activation.outputs_cut_short")
        return False
    log("activation.outputs_sent", files=sent)
    return True


async def _final(broker: BrokerClient, ending: Ending, live: LiveStream, code: int) -> int:
    """The live stream's last batch (a batch on its way let finish first), then the final
    call — both under `_report`: a stop that came while the batch went lost the output."""
    return await final_call(broker, ending, await live.finish(), code)


async def _report(sending: Awaitable[int], reported: Reported) -> int:
    """The output's sending (`final_call`), whole even if the runner is stopped meanwhile:
    the work is done, only its report is left (bounded by the broker client's timeouts). A
    stop — a second one too — waits for it, and then takes effect; `reported` says how the
    output was recorded either way."""
    task = asyncio.ensure_future(sending)
    stopped = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            stopped = True
    reported.code = task.result()
    if stopped:
        raise asyncio.CancelledError
    return reported.code


async def final_call(
    broker: BrokerClient, ending: Ending, live: StreamBatch | None, code: int
) -> int:
    """Send the output with the last history entries and live batch; the exit code. A refusal
    (a 4xx other than a fence) fails the activation and says why, as a refused call in the loop
    does. A broker that stays unavailable (5xx or unreachable through the retries) refused
    nothing: the output is never replaced by a stand-in for that — the error leaves, the
    runner exits `BROKER_UNREACHABLE`, and the orchestrator fails the attempt as retryable.

    Raises:
        FencedError, BrokerUnavailableError: the activation can do nothing more.
    """
    usage = ending.usage or {}
    # A failure's text quotes the model's error, which a provider may have made with the key
    # it refused: the output is an event the API shows, and as the log holds no secret, so
    # does it.
    text = redacted(ending.text)[:MAX_OUTPUT_CHARS]
    output = RunnerActivationOutput(text=text, usage=usage, reason=ending.reason)
    try:
        await broker.output(output, ending.history, live)
    except BrokerError as exc:
        if isinstance(exc, FencedError):
            raise
        log("activation.final_call_refused", error=str(exc))
        why = f"the tool-broker refused a request: {exc}"
        await broker.output(RunnerActivationOutput(text=why, usage=usage, reason="failed"))
        return exits.CRASHED
    return code


async def _run_loop(
    spec: RunnerActivationInput, broker: BrokerClient, loop: AgentLoop, workspace: Path
) -> tuple[Ending, int]:
    """The loop (after the agent package's assets, and the inputs where the runner fetches
    them) to its ending and exit code.

    Raises:
        FencedError, BrokerUnavailableError: the activation can do nothing more.
    """
    try:
        async with asyncio.timeout(spec.runner.wall_clock_seconds):
            await bring_assets(broker, workspace, spec.assets)
            if spec.files is not None:
                await fetch_inputs(broker, workspace, spec.files)
            ending = await loop.run()
        return ending, exits.BY_REASON[ending.reason]
    except ExchangeError as exc:
        why = f"the activation's files could not be brought in: {exc}"
        return Ending("failed", why, loop.usage()), exits.INPUTS_UNAVAILABLE
    except ModelFailedError as exc:
        why = f"the model failed: {exc}"
        # Refused for good, the whole chain through: the same activation again would be too
        # (DESIGN: content policy → no retry, report), so the exit says not to retry it. A
        # model of the chain that failed for a while (a 503 past its retries) may answer the
        # retry: one refused for good after it does not make the whole chain so.
        every = (*exc.earlier, exc.failure_class)
        refused = all(cls in REFUSED_FOR_GOOD for cls in every)
        code = exits.MODEL_REFUSED if refused else exits.MODEL_FAILED
        return Ending("failed", why, loop.usage(), exc.failure_class), code
    except TimeoutError:
        why = "the activation ran out of time"
        cut = loop.cut_round(why)  # before the audit's ends: which calls had started
        await loop.end_open_calls(f"tool call stopped: {why}")
        return Ending("failed", why, loop.usage(), history=cut), exits.TIMED_OUT
    except BrokerError as exc:
        if isinstance(exc, FencedError):
            raise
        why = f"the tool-broker refused a request: {exc}"
        return Ending("failed", why, loop.usage()), exits.CRASHED
    except BrokerUnavailableError:
        raise
    except asyncio.CancelledError:
        # Stopped (SIGTERM: a cancel, a drain): the calls it was running end in the audit
        # too, as they do at the wall clock, before the stop takes effect — and what the
        # round did is recorded (refused if a cancel fenced the activation), for the attempt
        # that takes the work over after a drain.
        cut = loop.cut_round("the runner was stopped")
        await _record_cut_round(broker, cut)  # first: a stop's grace is short (3 s at least)
        await loop.end_open_calls("tool call stopped: the runner was stopped", "cancelled")
        raise
    except Exception as exc:
        # A fault of the runner's own (a body it cannot read, a bound it did not expect): the
        # activation still ends with an output that says so and what it spent — else only
        # "runner exit 1" and an empty usage were left of it.
        log("activation.crashed", error=repr(exc))
        cut = loop.cut_round("the runner failed")
        await loop.end_open_calls("tool call stopped: the runner failed")
        why = f"the runner failed: {type(exc).__name__}: {str(exc)[:1_000]}"
        return Ending("failed", why, loop.usage(), history=cut), exits.CRASHED


async def _record_cut_round(broker: BrokerClient, entries: tuple[HistoryEntryIn, ...]) -> None:
    """What the round a stop cut short did, recorded within the stop's grace (bounded; best
    effort: a fenced activation's is refused, and a broker out of reach loses it)."""
    if not entries:
        return
    try:
        async with asyncio.timeout(CUT_ROUND_SECONDS):
            await broker.append_history(list(entries))
    except (BrokerError, BrokerUnavailableError, TimeoutError) as exc:
        log("activation.cut_round_unrecorded", error=repr(exc), results=len(entries))


def run(path: Path) -> int:
    """`python -m suzumio.runner run`: the activation of the input file; the exit code."""
    spec = _load(path)
    if spec is None:
        return exits.BAD_INPUT
    _not_dumpable()
    strays.as_runner()
    with contextlib.suppress(KeyboardInterrupt):
        return eventloop.run(_one(spec, None))
    return exits.TERMINATED


def _load(path: Path) -> RunnerActivationInput | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        sys.stderr.write(f"runner: no input file at {path}\n")
        return None
    return _parse(data, str(path))


def _parse(data: str | bytes, where: str) -> RunnerActivationInput | None:
    try:
        return RunnerActivationInput.model_validate_json(data)
    except ValidationError as exc:
        sys.stderr.write(f"runner: {where} is not a valid activation input:\n{exc}\n")
    return None


async def _one(
    spec: RunnerActivationInput, kept: Connections | None, stops: _Stops | None = None
) -> int:
    """The activation as a task SIGTERM and SIGINT cancel (the handlers only while it runs;
    a resident runner's, `stops`, are there for all its activations)."""
    loop = asyncio.get_running_loop()
    reported = Reported()
    task = asyncio.ensure_future(run_activation(spec, os.environ, kept, reported))
    if stops is None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
    else:
        stops.task = task
    try:
        return await task
    except asyncio.CancelledError:
        if reported.code is not None:
            log("activation.terminated_after_output", exit_code=reported.code)
            return reported.code
        log("activation.terminated")
        return exits.TERMINATED
    except Exception as exc:
        log("activation.crashed", error=repr(exc))
        return exits.CRASHED
    finally:
        if stops is None:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        else:
            stops.task = None
        # Background processes its commands started end with it (a resident runner's next
        # activation must not find them, nor may they outlive a cancel).
        if ended := await strays.end_children():
            log("activation.strays_ended", count=ended)


class _Stops:
    """A resident runner's SIGTERM and SIGINT, handled once for all its activations (adding
    and removing the handlers around each cost ~2% of its CPU): one cancels the activation
    running (`task`); between activations, it ends the runner, as the signal's default action
    does. The handler runs when the loop next looks at its events: a signal that came while
    an activation's request was being read in is taken by that activation (it ends
    terminated, as one stopped a moment later would), not by the runner."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.task: asyncio.Future[int] | None = None
        self._loop = loop
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop, sig)

    def close(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.remove_signal_handler(sig)

    def _stop(self, sig: signal.Signals) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            return
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)


def serve_resident(requests_fd: int, replies_fd: int, *, max_runs: int, log_path: Path) -> int:
    """A resident runner (forked by the fork server for a warm session): run the activations
    that come in on `requests_fd` one after the other — each with its own environment, working
    directory and log, on one event loop whose HTTP clients stay open between
    them (`Connections`) — and say how each ended on `replies_fd` (with the end of what it
    logged, when it failed); leave after `max_runs` of them, or when the worker closes the
    pipe. SIGTERM or SIGINT cancels the activation running; between activations, it ends the
    runner.

    An activation's input comes in its request, never through a file (its token is on no
    disk), and what it logs goes on in the runner's one log (`log_path`, its stdout and
    stderr), so an activation here costs no file of its own."""
    _not_dumpable()
    strays.as_runner()
    with contextlib.suppress(KeyboardInterrupt):
        eventloop.run(_serve_resident(requests_fd, replies_fd, max_runs, log_path))
    return 0


async def _serve_resident(requests_fd: int, replies_fd: int, max_runs: int, log_path: Path) -> None:
    loop = asyncio.get_running_loop()
    # An input grows with its session's history: a line as long as any its worker can be sent
    # (a dispatch is one bus message), not a stream's default 64 KiB.
    requests = asyncio.StreamReader(limit=MAX_REQUEST_LINE)
    # The transport owns the pipe from here: closing it closes the pipe (once — a second
    # close of the same descriptor could close one opened since).
    pipe = os.fdopen(requests_fd, "rb", buffering=0)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(requests), pipe
    )
    try:
        kept = Connections()
        stops = _Stops(loop)
        try:
            for _ in range(max_runs):
                line = await requests.readline()
                if not line:
                    break
                request = orjson.loads(line)
                os.chdir(request["cwd"])
                _become(request["env"])
                context.clear()
                since = os.fstat(sys.stderr.fileno()).st_size  # where its lines begin
                spec = _parse(request["spec"], "the request")
                code = exits.BAD_INPUT if spec is None else await _one(spec, kept, stops)
                sys.stdout.flush()
                sys.stderr.flush()
                answer: dict[str, object] = {"id": request["id"], "done": code}
                if code != exits.COMPLETED:
                    answer["tail"] = tail(log_path, since)
                # A line, far under a pipe's buffer: never blocks; but a write of more than
                # PIPE_BUF (an escaped tail) may come back short if a signal comes meanwhile,
                # and a line cut short would leave the run waiting for its deadline.
                forkserver.write_all(replies_fd, json.dumps(answer).encode() + b"\n")
        finally:
            stops.close()
            await kept.aclose()
            os.close(replies_fd)
    finally:
        transport.close()
        await asyncio.sleep(0)  # its closing callbacks run before the loop ends


def _become(env: Mapping[str, str], environ: MutableMapping[str, str] = os.environ) -> None:
    """The environment is `env` and nothing else. Changed key by key: a session's activations
    differ in a few ids, and `os.environ.clear()` (each key popped after a fresh iteration,
    each a `unsetenv`) then the update cost a resident runner ~2% of its CPU per activation."""
    for key in [k for k in environ if k not in env]:
        del environ[key]
    for key, value in env.items():
        if environ.get(key) != value:
            environ[key] = value


def _not_dumpable() -> None:
    """No other process of the same user (a tool's shell) may read this one's memory or
    /proc/<pid>/environ, where the token and the provider keys are."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        log("runner.dumpable_unchanged")
