"""`python -m suzumio.runner run`: one activation, from the input file to the output."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from suzumio.contracts.runner import RunnerActivationInput, RunnerActivationOutput
from suzumio.runner import exits
from suzumio.runner.agent import MAX_OUTPUT_CHARS, AgentLoop, Ending, ModelFailedError
from suzumio.runner.broker import BrokerClient, BrokerError, BrokerUnavailableError, FencedError
from suzumio.runner.handover import fetch_inputs, send_outputs
from suzumio.runner.live import LiveStream
from suzumio.runner.log import context, log
from suzumio.runner.model import ModelClient, endpoint_for
from suzumio.runner.toolbox import Toolbox
from suzumio.runner.tools.base import Mount, ToolContext
from suzumio.runner.workfiles import ExchangeError

# What a shell command may see of the runner's environment: never the token or a key.
SHELL_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "TZ", "TERM")


def load_input(path: Path) -> RunnerActivationInput:
    return RunnerActivationInput.model_validate_json(path.read_bytes())


def shell_env(env: Mapping[str, str], workspace: str) -> dict[str, str]:
    kept = {k: env[k] for k in SHELL_ENV_KEEP if k in env}
    kept.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    return {**kept, "HOME": workspace, "TMPDIR": f"{workspace}/.tmp"}


async def run_activation(spec: RunnerActivationInput, env: Mapping[str, str]) -> int:
    context.update(activation=spec.activation.id, session=spec.session.id, agent=spec.agent.id)
    workspace = Path(spec.workspace)
    (workspace / ".tmp").mkdir(parents=True, exist_ok=True)
    tool_ctx = ToolContext(
        workspace=workspace,
        mounts=tuple(Mount(Path(m.path), m.writable) for m in spec.mounts),
        allow_private_network=spec.allow_private_network,
        env=shell_env(env, spec.workspace),
    )
    broker = BrokerClient(spec.controller_url, spec.token)
    models = [
        ModelClient(m, endpoint_for(m, env)) for m in (spec.agent.model, *spec.agent.fallbacks)
    ]
    live = LiveStream(broker)
    live.start()
    secrets = [v for k, v in env.items() if k.endswith(("API_KEY", "_TOKEN", "_SECRET"))]
    loop = AgentLoop(spec, broker, models, Toolbox(spec, broker, tool_ctx), live, secrets)
    code = exits.CRASHED
    try:
        ending, code = await _run_loop(spec, broker, loop, workspace)
        await live.close()
        if spec.files is not None and code != exits.INPUTS_UNAVAILABLE:
            sent = await send_outputs(broker, workspace, spec.files)
            log("activation.outputs_sent", files=sent)
        text = ending.text[:MAX_OUTPUT_CHARS]
        await broker.output(
            RunnerActivationOutput(text=text, usage=ending.usage or {}, reason=ending.reason)
        )
        log("activation.ended", reason=ending.reason, exit_code=code, calls=loop.model_calls)
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


async def _run_loop(
    spec: RunnerActivationInput, broker: BrokerClient, loop: AgentLoop, workspace: Path
) -> tuple[Ending, int]:
    """The loop (after the inputs, where the runner fetches them) to its ending and exit code.

    Raises:
        FencedError, BrokerUnavailableError: the activation can do nothing more.
    """
    try:
        async with asyncio.timeout(spec.runner.wall_clock_seconds):
            if spec.files is not None:
                await fetch_inputs(broker, workspace, spec.files)
            ending = await loop.run()
        return ending, exits.BY_REASON[ending.reason]
    except ExchangeError as exc:
        ending = Ending("failed", f"the session's files could not be brought in: {exc}")
        return ending, exits.INPUTS_UNAVAILABLE
    except ModelFailedError as exc:
        ending = Ending("failed", f"the model failed: {exc}", detail=exc.failure_class)
        return ending, exits.MODEL_FAILED
    except TimeoutError:
        return Ending("failed", "the activation ran out of time"), exits.TIMED_OUT
    except BrokerError as exc:
        if isinstance(exc, FencedError):
            raise
        return Ending("failed", f"the tool-broker refused a request: {exc}"), exits.CRASHED


def run(path: Path) -> int:
    try:
        spec = load_input(path)
    except FileNotFoundError:
        sys.stderr.write(f"runner: no input file at {path}\n")
        return exits.BAD_INPUT
    except ValidationError as exc:
        sys.stderr.write(f"runner: {path} is not a valid activation input:\n{exc}\n")
        return exits.BAD_INPUT

    _not_dumpable()

    async def main() -> int:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        try:
            return await run_activation(spec, os.environ)
        except asyncio.CancelledError:
            log("activation.terminated")
            return exits.TERMINATED
        except Exception as exc:
            log("activation.crashed", error=repr(exc))
            return exits.CRASHED

    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(main())
    return exits.TERMINATED


def serve_resident(requests_fd: int, replies_fd: int, *, max_runs: int) -> int:
    """A resident runner (forked by the fork server for a warm session): run the activations
    that come in on `requests_fd` one after the other, each as `run` would (its own event loop,
    signal handlers, environment and log), and say how each ended on `replies_fd`; leave after
    `max_runs` of them, or when the worker closes the pipe."""
    with (
        os.fdopen(requests_fd, "rb") as requests,
        os.fdopen(replies_fd, "wb", buffering=0) as replies,
    ):
        for _ in range(max_runs):
            line = requests.readline()
            if not line:
                break
            request = json.loads(line)
            out = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.close(out)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            context.clear()
            code = run(Path(request["input"]))
            sys.stdout.flush()
            sys.stderr.flush()
            replies.write(json.dumps({"id": request["id"], "done": code}).encode() + b"\n")
    return 0


def _not_dumpable() -> None:
    """No other process of the same user (a tool's shell) may read this one's memory or
    /proc/<pid>/environ, where the token and the provider keys are."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        log("runner.dumpable_unchanged")
